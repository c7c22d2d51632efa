"""What a blocked head keeps from the jobs ranked after it: the GPUs it needs, for one pass
(`hold_for_first`), and nodes drained for it across passes (reservations, `reserve_after_s`).
It owns those choices and the nodes they block; which heads may hold or reserve (the fair
order) is `placer.py`'s, and the reservations themselves are kept in the shared state
(`PlacerState.reserved`, `node_reserved`).

GPUs kept for the pass: a blocked head of the domain its priority's fair order serves first
keeps its GPU count free for the rest of the pass, one head a priority rank: a job ranked after
it starts only where the free GPUs stay at least that many. A count is not a place: the free
GPUs it keeps may be scattered over nodes, and a CPU-only head keeps none.

Reservations: a head that has waited `reserve_after_s` gets, for each of its units, the node
with the most free of what the unit needs most; no other job may start (or pre-empt) there
until the head starts or leaves the queue, so what frees on those nodes accumulates for it.
"""

from __future__ import annotations

from collections import defaultdict

from longhaul.placement.placement import Job
from longhaul.placement.state import PlacerState


class Blocked:
    """The nodes a job may not use (`in` is all `FreeView` asks): drained for another job."""

    __slots__ = ("own", "reserved")

    def __init__(self, reserved, own=frozenset()):
        self.reserved, self.own = reserved, own

    def __contains__(self, i: int) -> bool:
        return i not in self.own and i in self.reserved


class Holds:
    def __init__(self, state: PlacerState):
        self.s = state
        self.gpus_kept = 0  # GPUs kept free this pass for blocked heads
        self.keeping: set[int] = set()  # the order ranks whose blocked head keeps its GPUs this pass

    # GPUs, for one pass
    def begin_pass(self) -> None:
        self.gpus_kept, self.keeping = 0, set()

    def keep_for(self, head: Job, rank: int) -> None:
        """`head`, of the domain served first at order rank `rank`, does not fit: with
        `hold_for_first` it keeps its GPUs for the rest of the pass (the first such head of a rank only)."""
        if self.s.cfg.hold_for_first and rank not in self.keeping:
            self.keeping.add(rank)
            self.gpus_kept += head.total[2]

    def keeps_out(self, job: Job) -> bool:
        """Whether `job` would take GPUs kept this pass for a blocked head ranked before it."""
        return bool(self.gpus_kept and job.total[2] and self.s.c.free_total[2] - job.total[2] < self.gpus_kept)

    # nodes, across passes
    def blocked(self, own=frozenset()) -> Blocked:
        """The nodes a job may not use (`own`: those drained for it)."""
        return Blocked(self.s.node_reserved, own)

    def reserve(self, job: Job) -> None:
        """Drain, for `job`, the nodes with the most free now that could hold its units."""
        c, taken, nodes = self.s.c, defaultdict(lambda: [0, 0, 0]), set()
        for u in sorted(job.needs, reverse=True, key=lambda u: (u[2], u[0], u[1])):
            k = max(range(3), key=lambda k: u[k] / c.total[k] if c.total[k] else 0.0)
            fits = [i for i in range(len(c.nodes)) if i not in self.s.node_reserved
                    and all(c.cap[i][m] - taken[i][m] >= u[m] for m in range(3))]
            if not fits:
                return  # it can never fit while other reservations stand
            i = max(fits, key=lambda i: (c.free[i][k] - taken[i][k], -i))
            for m in range(3):
                taken[i][m] += u[m]
            nodes.add(i)
        self.s.reserved[job.id] = nodes
        for i in nodes:
            self.s.node_reserved[i] = job.id

    def drop(self, job_id: str) -> bool:
        """End `job_id`'s reservation, if it has one (its nodes are open to every job again)."""
        if job_id not in self.s.reserved:
            return False
        for i in self.s.reserved.pop(job_id):
            self.s.node_reserved.pop(i, None)
        return True
