"""How long the placer expects a job to run: the running median of how long the same kind of job
took when it last finished, learnt from what the placer itself observes (no job declares its
duration, and the placer never reads the true one).

A job's *kind* is its domain and its shape (the tuple of its work units: a domain's rollout
batch of 2 workers and 3 pools is one kind, its evaluation another). Its estimate is the median
wall time, start to finish, of the last `window` runs of that kind that finished without being
pre-empted (a restarted run does only what was left, so it would bias the median short); with
fewer than `min_runs` of them, the median over that shape in every domain; with none, the median
over every job seen; before anything finished, `default_s`.

It owns the estimates only; what they are used for (which nodes a blocked head waits for, which
jobs may run on them meanwhile) is the placer's. The medians are as good as the workload is
repeatable: on the simulator's lognormal durations (sigma 0.7-1) a single estimate is off by a
factor of about 2 either way.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque

from longhaul.placement.placement import Job


class _Median:
    """The median of the last `window` values (a sorted copy beside the window)."""

    def __init__(self, window: int):
        self.recent: deque[float] = deque(maxlen=window)
        self.ordered: list[float] = []

    def add(self, x: float) -> None:
        if len(self.recent) == self.recent.maxlen:
            self.ordered.pop(bisect.bisect_left(self.ordered, self.recent[0]))
        self.recent.append(x)
        bisect.insort(self.ordered, x)

    def __len__(self) -> int:
        return len(self.ordered)

    def median(self) -> float:
        return self.ordered[len(self.ordered) // 2]


class Durations:
    def __init__(self, window: int = 32, min_runs: int = 3, default_s: float = 1800.0):
        self.window, self.min_runs, self.default_s = window, min_runs, default_s
        self.by_kind: dict[tuple, _Median] = defaultdict(lambda: _Median(window))  # (domain, units) -> recent wall times
        self.by_shape: dict[tuple, _Median] = defaultdict(lambda: _Median(window))  # units -> recent wall times
        self.all = _Median(4 * window)

    def observe(self, job: Job, seconds: float) -> None:
        """`job` ran to completion in `seconds` of wall time, start to finish, without interruption."""
        for m in (self.by_kind[(job.domain, job.units)], self.by_shape[job.units], self.all):
            m.add(seconds)

    def expect(self, job: Job) -> float:
        """The wall seconds a run of `job` is expected to take, start to finish."""
        for table, key in ((self.by_kind, (job.domain, job.units)), (self.by_shape, job.units)):
            m = table.get(key)
            if m is not None and len(m) >= self.min_runs:
                return m.median()
        return self.all.median() if len(self.all) else self.default_s
