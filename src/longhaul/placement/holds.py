"""Holding nodes for blocked heads (`Placer` mixes this in): which nodes a head that does not fit
waits for, and which jobs ranked after it may still use them during the pass. It owns that
choice; the order, the queues and the books are `placer.py`'s, the estimates `durations.py`'s.

With `hold_nodes: n`, each of the first n heads of a pass (in the fair order) that does not fit
holds, for each of its units, the node closest to fitting it; jobs tried after it in the pass
may not start there (nor pre-empt there), so what frees on those nodes accumulates for the head
instead of going, piece by piece, to smaller jobs ranked after it. A count of GPUs
(`hold_for_first`) does not do that: the free GPUs it keeps are scattered, and a unit of 8 GPUs
still waits for a whole node. Holds last one pass and are chosen again at the next, so a head
that starts, or falls behind in the fair order, frees its nodes at once.

With `easy_backfill` (EASY backfill on estimates), the node closest to fitting a unit is the one
expected to fit it earliest (its running jobs end at their expected ends: start plus the learnt
estimate; a job past its estimate is expected to need one more estimate from now), and a job
ranked after the head may start on a held node if it is expected to end before the head is
expected to start there. Without it, the closest node is the one with the most free now and a
held node is closed to every job ranked after its head.

A job that outruns its estimate delays the head it was let in beside; the next pass sees that
(the overrun job's expected end moves on) and may hold another node for the head instead.

Reservations (`reserve_after_s`, `_reserve`) drain nodes for a head across passes: see `placer.py`.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict

from longhaul.placement.placement import Job


class Blocked:
    """The nodes a job may not use (`in` is all `FreeView` asks): drained for another job, or held
    this pass by a head expected to start there before the job is expected to end."""

    __slots__ = ("reserved", "held", "end", "own")

    def __init__(self, reserved, held: dict[int, float], end: float, own=frozenset()):
        self.reserved, self.held, self.end, self.own = reserved, held, end, own

    def __contains__(self, i: int) -> bool:
        if i in self.own:
            return False
        return i in self.reserved or self.held.get(i, math.inf) < self.end


class Holds:
    def _blocked(self, own=frozenset(), end: float = math.inf) -> Blocked:
        """What a job that is expected to end at `end` may not use (`own`: drained for it)."""
        return Blocked(self.node_reserved, self._held, end, own)

    def _open_held(self, end: float) -> int:
        """How many held nodes a job ending at `end` may use (jobs with the same count see the same nodes)."""
        return len(self._held_until) - bisect.bisect_left(self._held_until, end)

    def _expected_end(self, jid: str, now: float) -> float:
        """When running job `jid` is expected to end: its start plus the estimate it started with,
        or, past that, one more estimate from now."""
        if jid in self.stopping:  # told to save (handover.py): it leaves when the save ends
            return max(now, self.stopping[jid][1])
        if jid in self.awaiting:  # a head's claim: held from when its victims have saved, for its run
            return max(now, self.awaiting[jid][1]) + self.durations.expect(self.jobs[jid])
        run = self.running[jid]
        est = self._estimate_at_start.get(jid) or self.durations.expect(run.job)
        return run.started + est if run.started + est > now else now + est

    def _fit_time(self, i: int, u, taken, now: float) -> float:
        """When node `i` is expected to have room for `u` beside `taken`: now, or the expected end
        of the running job after which it would."""
        c = self.c
        free = [c.free[i][k] - taken[k] for k in range(3)]
        if free[0] >= u[0] and free[1] >= u[1] and free[2] >= u[2]:
            return now
        for t, jid in sorted((self._expected_end(jid, now), jid) for jid in c.node_jobs[i]):
            for j, held in c.holdings[jid]:
                if j == i:
                    free = [free[k] + held[k] for k in range(3)]
            if free[0] >= u[0] and free[1] >= u[1] and free[2] >= u[2]:
                return t
        return math.inf

    def _closest_nodes(self, job: Job, now: float) -> tuple[dict[int, list[int]], float] | None:
        """For `job`'s GPU units, the nodes closest to holding them, among the `hold_candidates`
        unheld nodes with the most free GPUs: with `easy_backfill` the one expected to fit each
        unit earliest, else the one with the most free GPUs left. Returns what each node would
        give it, and when the last is expected to fit (None: too few candidates could ever hold it).
        CPU-only units are not held: the GPUs are what a saturated cluster lacks."""
        c, cfg, blocked = self.c, self.cfg, self._blocked()
        gpu_units = sorted((u for u in job.needs if u[2]), reverse=True, key=lambda u: (u[2], u[0], u[1]))
        want = max(cfg.hold_candidates, 2 * len(gpu_units))
        cands = []
        for i in c.most_free_gpus():
            if i not in blocked:
                cands.append(i)
                if len(cands) == want:
                    break
        taken: dict[int, list[int]] = {i: [0, 0, 0] for i in cands}
        start = now
        for u in gpu_units:
            fits = [i for i in cands if all(c.cap[i][m] - taken[i][m] >= u[m] for m in range(3))]
            if not fits:
                return None
            if cfg.easy_backfill:
                at, i = min((self._fit_time(i, u, taken[i], now), i) for i in fits)
                start = max(start, at)
            else:
                i = max(fits, key=lambda i: (c.free[i][2] - taken[i][2], -i))
            taken[i] = [taken[i][m] + u[m] for m in range(3)]
        return {i: t for i, t in taken.items() if t[2]}, start

    def _hold_for(self, job: Job, now: float) -> None:
        """`job` heads its queue and does not fit: hold the nodes closest to fitting it for the rest
        of the pass (with `easy_backfill`, open to jobs expected to end before it can start)."""
        got = self._closest_nodes(job, now)
        if got is None:
            return
        nodes, start = got
        until = start if self.cfg.easy_backfill else -math.inf  # jobs expected to end by then may use the nodes; without estimates, none
        for i in nodes:
            self._held[i] = until
            bisect.insort(self._held_until, until)

    def _reserve(self, job: Job) -> None:
        """Drain, for `job`, the nodes with the most free now that could hold its units."""
        c, taken, nodes = self.c, defaultdict(lambda: [0, 0, 0]), set()
        for u in sorted(job.needs, reverse=True, key=lambda u: (u[2], u[0], u[1])):
            k = max(range(3), key=lambda k: u[k] / c.total[k] if c.total[k] else 0.0)
            fits = [i for i in range(len(c.nodes)) if i not in self.node_reserved
                    and all(c.cap[i][m] - taken[i][m] >= u[m] for m in range(3))]
            if not fits:
                return  # it can never fit while other reservations stand
            i = max(fits, key=lambda i: (c.free[i][k] - taken[i][k], -i))
            for m in range(3):
                taken[i][m] += u[m]
            nodes.add(i)
        self.reserved[job.id] = nodes
        for i in nodes:
            self.node_reserved[i] = job.id
