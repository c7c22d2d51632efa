"""`ThreadGovernor`: the engine's intra-op thread count, chosen from what the machine has free.

A decode step of a small model is hundreds of short parallel regions, each ending at a join
where every thread must arrive. When another process shares the cores, one of the engine's
threads is often descheduled and every region waits for it: two threads on two cores beside
one busy process can run several times slower than one thread. No static count is right on a
shared machine, so the governor measures.

Where the kernel's counters are readable (`cpus.CpuLoad`: Linux), it reads what other processes
used of this process's CPUs over the last quarter second and runs as many threads as leave them
room: a neighbour using more than 0.4 of a CPU takes a thread away, and the thread comes back
once the neighbours use at most 0.25 (a band, so that a neighbour near the line does not make
the count flap). The first choice is made after a twentieth of a second (two threads beside a
busy neighbour can take that long for one step): a governor younger than that, whose engine
was just made, waits out the rest before its first step (at most that twentieth of a second,
once), so that not even the first step, a batch's prefill, runs at a count it would not choose.
Nothing is timed.

Elsewhere it times steps: every so often it runs a few steps at each candidate count (the cap
the caller set, half of it, one) and keeps the fastest, probing again sooner after a change and
less often while the choice holds (its interval doubles up to a bound). Only steps of the same
shape (sequences, new tokens) are compared; a probe whose shape changes is dropped. The first
step after a switch is not timed (the thread pool wakes up).

Thread count does not change what is computed: the native kernels split work by output
columns, never along a reduction, so outputs are the same whichever count runs (tested).

Owns the choice and its timing only; the caller brackets each step with `begin` and `end`.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch

from longhaul.cpus import CpuLoad

WINDOW_S = 0.25  # how long a reading of the neighbours' CPU use averages over
FIRST_WINDOW_S = 0.05  # ... but the first choice is made as soon as this much has passed
TAKE = 0.4  # a neighbour using more than this share of a CPU takes a thread away
GIVE = 0.25  # ... and the thread comes back when neighbours use at most this much


def threads_for(load: CpuLoad, n: int, cap: int) -> int:
    """The thread count after `n` threads ran since `load`'s last reading (read now): as many as
    the neighbours left free, with the TAKE / GIVE band, at most `cap`."""
    _, others = load.others()
    free = load.cpus - others
    want = max(1, min(cap, math.floor(free + TAKE)))
    if want > n:
        want = max(n, min(want, math.floor(free + GIVE)))
    return want


class SectionThreads:
    """Intra-op threads for a long section that recurs, such as a training step: each run of it
    gets as many threads as the neighbours left free during the previous run (its own window, so
    what ran between two runs, e.g. generation and its sandboxed commands, does not count).

        with section_threads:
            trainer.step(batch)

    Caps at the thread count set when the section starts and gives it back at the end. Without
    readable counters (`CpuLoad.open()` None) it leaves the count alone."""

    def __init__(self, load: CpuLoad | None | str = "auto", set_threads: Callable[[int], None] = torch.set_num_threads,
                 get_threads: Callable[[], int] = torch.get_num_threads):
        self.load = CpuLoad.open() if load == "auto" else load
        self._set, self._get = set_threads, get_threads
        self.choice: int | None = None
        self._run: tuple[int, int] | None = None  # (cap, count) of the run in progress

    def __enter__(self) -> "SectionThreads":
        if self.load is None:
            return self
        cap = self._get()
        n = min(self.choice or cap, cap)
        if n != cap:
            self._set(n)
        self._run = (cap, n)
        self.load.others()  # the window starts here
        return self

    def __exit__(self, *exc) -> None:
        if self._run is None:
            return
        cap, n = self._run
        self._run = None
        self.choice = threads_for(self.load, n, cap)
        if self._get() != cap:
            self._set(cap)


class ThreadGovernor:
    def __init__(self, probe_steps: int = 3, first_probe: int = 4, min_interval: int = 32, max_interval: int = 512,
                 clock: Callable[[], float] = time.perf_counter, set_threads: Callable[[int], None] = torch.set_num_threads,
                 get_threads: Callable[[], int] = torch.get_num_threads, load: CpuLoad | None | str = "auto",
                 sleep: Callable[[float], None] = time.sleep):
        self.load = CpuLoad.open() if load == "auto" else load  # None: time steps instead
        self._sleep = sleep
        self.probe_steps = probe_steps  # timed steps per candidate; the median decides
        self.min_interval, self.max_interval = min_interval, max_interval  # steps between probes
        self.clock, self._set, self._get = clock, set_threads, get_threads
        self.choice: int | None = None  # None: the cap
        self.interval = min_interval
        self._until_probe = first_probe  # probe early: a contended machine is found within a few steps
        self._plan: list[int] = []  # the thread count of each remaining probe step (count repeated)
        self._times: dict[int, list[float]] = {}
        self._shape = None
        self._step = None  # (threads, timed, t0) of the step in flight
        self._cap = 1
        self._applied: int | None = None  # the count we set last; a different current count is the caller's
        self.switches = 0  # times the choice changed (a metric)

    def _candidates(self, cap: int) -> list[int]:
        return sorted({cap, max(1, cap // 2), 1}, reverse=True)

    def begin(self, shape) -> int:
        """Before a step of this shape: set and return the thread count it runs with. The count
        stays set after the step (switching costs more than a step); `release` gives it back."""
        cur = self._get()
        if cur != self._applied:
            self._cap = cur  # the caller set it since our last step: that is the cap now
        cap = self._cap
        if cap <= 1:
            self._step = None
            return cur
        if self.load is not None:
            n = self._sensed(cap)
            if n != cur:
                self._set(n)
            self._applied = n
            self._step = None
            return n
        if self._plan and shape != self._shape:
            self._plan, self._times = [], {}  # the batch changed under the probe: try again soon
            self._until_probe = 1
        if not self._plan and self._until_probe <= 0:
            self._shape, self._times = shape, {}
            for n in self._candidates(cap):
                self._plan += [n] * (self.probe_steps + 1)
        if self._plan:
            n = self._plan.pop(0)
            timed = n in self._times  # the first step at each count only warms its pool up
            self._times.setdefault(n, [])
        else:
            n, timed = min(self.choice or cap, cap), False
            self._until_probe -= 1
        if n != cur:
            self._set(n)
        self._applied = n
        self._step = (n, timed, self.clock())
        return n

    def _sensed(self, cap: int) -> int:
        """The count for the next step from the neighbours' CPU use (read at most every WINDOW_S)."""
        n = min(self.choice or cap, cap)
        if self.choice is None:  # the first step waits out the first window rather than guess
            self._sleep(max(0.0, FIRST_WINDOW_S - self.load.elapsed()))
        elif self.load.elapsed() < WINDOW_S:
            return n
        want = threads_for(self.load, n, cap)
        if want != n:
            self.switches += 1
        self.choice = want
        return want

    def release(self) -> None:
        """Give the caller's thread count back (e.g. when `generate` returns to a trainer)."""
        if self._applied is not None and self._applied != self._cap and self._get() == self._applied:
            self._set(self._cap)
        self._applied = None

    def end(self) -> None:
        """After the step: record its time; settle a finished probe."""
        if self._step is None:
            return
        n, timed, t0 = self._step
        self._step = None
        if timed:
            self._times[n].append(self.clock() - t0)
        if not self._plan and self._times:
            best = min(self._times, key=lambda k: (statistics.median(self._times[k]) if self._times[k] else float("inf"), -k))
            if best != (self.choice or self._cap):
                self.switches += 1
                self.interval = self.min_interval
            else:
                self.interval = min(self.interval * 2, self.max_interval)
            self.choice = best
            self._times = {}
            self._until_probe = self.interval
