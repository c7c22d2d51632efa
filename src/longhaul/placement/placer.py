"""The placer: queued jobs of many domains onto one cluster, by priority and weighted fair share,
with pre-emption and draining reservations. One call of `schedule(now)` is one pass.

Order (`order="fair"`): one FIFO queue per domain. The next job tried is the head of the domain
with the highest head priority and, within that priority, the lowest *level* per weight: its
decayed mean share of the last hours, what it holds now counted `usage_lookahead_s` ahead
(`usage_half_life_s`, see `usage.py`; None: the share held now only). A share is a fraction of the cluster's GPUs
(`share="gpu"`: GPU-hours are what domains are entitled to; CPUs and memory are packed, not
shared out) or the dominant share, the largest of its CPU, memory and GPU fractions
(`share="dominant"`: weighted DRF).
With `queue_order="smallest"` a domain's queue is ordered by GPUs asked (then age, then dominant
share) instead of submission: its share is the same, fewer of its jobs wait behind its gangs,
and the shards of one batch stay together, in the order of their batches.
With `split_elastic`, an elastic job (a rollout batch, `Job.elastic`) is queued as its shards,
one worker each (`placement.shards`): they start as room frees and are pre-empted one at a
time, so a batch neither waits for room for all its workers nor loses them all to one eviction.
A batch whose turn it is in the fair order keeps it while its next shard fits (it starts what
fits of it, as the whole gang would have).
A training run whose nodes are data-parallel replicas (`Job.replica`) is split the same way: its
replicas start as room frees, and one whose peers work is killed, not told (they keep the state;
evicting it costs their regroup), while the last one is told and saves.
With `backfill`, a head that does not fit does not stop the pass: up to `domain_scan` jobs
behind it in its domain, then other domains, are tried (`scan_limit` attempts a pass).
With `hold_for_first`, a blocked head of the domain its priority's fair order serves first
keeps its GPUs free for the rest of the pass (jobs ranked after it start only on GPUs beyond
those; holds.py): backfill then cannot hand an over-share domain the GPUs an under-share gang
waits for. Not work-conserving, so bounded: one head a priority rank, one pass at a time;
CPU-only jobs are not held.
`order="fifo"` is one queue in submission order; without backfill a blocked head stops it.

Pre-emption (`preempt`, `fair_preempt_after_s`): see `preemption.py`; victims that save on
notice hand their nodes over once saved (`notice`): see `handover.py`.

Class floor (`min_class_share`): priorities are strict except that a priority class with
waiting jobs is guaranteed that share of the cluster (GPUs, or the `share` measure): while it
holds less, its heads are ordered before every priority (by level within the class), and
higher priorities may not evict its jobs below the floor; above it, strict priority holds (the
higher class takes what it can use and pre-empts anything above the floor). It bounds a lower
class's wait by its own demand against the floor rather than by the higher classes' peaks.

Reservations: a head that has waited `reserve_after_s` without fitting (a large gang that
backfill keeps overtaking) gets nodes drained for it if its domain came first in its
priority's fair order when the pass began (so an over-share domain never drains nodes ahead of
the domains below it): up to `max_reservations` jobs at a time each hold a
set of nodes (the ones with the most free now) that no other job may start on;
the job starts as soon as it fits, and its reservation ends then (`holds.py` drains them).

Resources are taken only through `Cluster.allocate` (all or nothing): the placer never
oversubscribes a node, whatever the policy chooses.

The parts: `Placer` owns the order of a pass (which job is tried, and whether it starts,
pre-empts or reserves) and composes collaborators over one `PlacerState` (state.py, with the
settings, `PlacerConfig`): `Books` (books.py) moves jobs between queued, running and saving,
`Holds` (holds.py) keeps GPUs and drains nodes for blocked heads, `Preemption` (preemption.py)
chooses and evicts victims, `Handover` (handover.py) hands a told victim's nodes over to its head.
"""

from __future__ import annotations

import heapq
from itertools import islice

from longhaul.placement.books import Books
from longhaul.placement.cluster import Cluster, Resources
from longhaul.placement.handover import Handover
from longhaul.placement.holds import Holds
from longhaul.placement.placement import PLACEMENT, FreeView, Job, Running, shards
from longhaul.placement.preemption import Preemption
from longhaul.placement.state import PlacerConfig, PlacerState

OUTSIDE = "(outside work)"  # the ledger entry of what the cluster's other users hold (`hold_outside`)
FLOOR = 1 << 30  # added to the order rank of a class below its `min_class_share`: served before every priority


PRESETS = {
    # strict priorities starve priority 0 in peaks: a class floor; a domain's small jobs before its gangs; a blocked
    # fair-first gang keeps its GPUs for the pass. Fair share: heads of domains under their estimated entitlement evict
    # jobs of domains over theirs at once; training runs are told and save, other victims must have saved since they
    # (re)started, and only kills count against max_preemptions (none here: a cap made evicted jobs immune and the error rose
    # 0.085 -> 0.101). A search first weighs the victims killed at once (`instant_first`: no head waits for a save).
    # Rollout batches run as their workers (`split_elastic`). Use is remembered with a 30 min half-life, the time scale
    # the hourly windows judge (with 90 min the hourly error was 0.061 / 0.047 on seeds 0 / 1, with 30 min 0.034 / 0.033),
    # and the floor is 15% (12% with the 30 min memory put seed 1's p99 above FIFO's, 240 vs 199 min). Full runs
    # (docs/scheduling.md): fairness 0.033 / 0.033 / 0.056 in 6 h windows, 0.030 / 0.035 / 0.068 by the hour on seeds
    # 0 / 1 / 2; p99 322 / 147 / 318 min (FIFO 352 / 199 / 585)
    "longhaul": PlacerConfig(fair_preempt_after_s=0.0, entitled_preempt=True, preempt_keeps_progress=True, notice=True,
                             max_preemptions=None, preempt_tries=64, usage_half_life_s=1800.0, hold_for_first=True,
                             min_class_share=0.15, queue_order="smallest", instant_first=True, split_elastic=True),
    "fifo": PlacerConfig(order="fifo", policy="first_fit", backfill=False, preempt=False, reserve_after_s=None),
    "fifo_backfill": PlacerConfig(order="fifo", policy="first_fit", backfill=True, preempt=False, reserve_after_s=None),
}


def _state(name: str) -> property:
    """Read access to `PlacerState.<name>` from the placer (what its users inspect)."""
    return property(lambda self: getattr(self.state, name), doc=f"`PlacerState.{name}`")


class Placer:
    c, cfg, queues, jobs, waiting_since = _state("c"), _state("cfg"), _state("queues"), _state("jobs"), _state("waiting_since")
    running, stopping, awaiting, replicas_running = _state("running"), _state("stopping"), _state("awaiting"), _state("replicas_running")
    reserved, node_reserved, entitled = _state("reserved"), _state("node_reserved"), _state("entitled")
    preemptions, evictions, kills = _state("preemptions"), _state("evictions"), _state("kills")

    def __init__(self, cluster: Cluster, cfg: PlacerConfig = PlacerConfig(), weights: dict[str, float] | None = None):
        self.state = PlacerState(cluster, cfg, weights or {})
        self.policy = PLACEMENT.get_fn(cfg.policy)
        self.holds = Holds(self.state)
        self.books = Books(self.state, self.holds)
        self.handover = Handover(self.state, self.books, self.holds)
        self.preemption = Preemption(self.state, self.policy, self.books, self.holds, self.handover)

    # the queues and the books
    def submit(self, job: Job, now: float) -> tuple[Job, ...]:
        """Queue `job`; returns what was queued: the job, or its shards with `split_elastic`."""
        s = self.state
        parts = shards(job) if s.cfg.split_elastic else (job,)
        for part in parts:
            if part.id in s.jobs or part.id in s.running or part.id in s.stopping:
                raise ValueError(f"job {part.id!r} is already queued or running")
        for part in parts:
            self.books.enqueue(part, now)
        return parts

    def release(self, job_id: str, now: float | None = None) -> Running:
        """A running job finished (or was stopped) at `now` (default: the latest pass): its resources go back."""
        return self.books.release(job_id, self.state.clock if now is None else now)

    def hold_outside(self, requests: list[tuple[int, Resources]]) -> None:
        """Book what the cluster's other users hold on each node (node index, resources), in place
        of the last booking: the jobs plan around it, and what it gives back is open to them again."""
        c = self.state.c
        before = c.release(OUTSIDE)
        if requests:
            c.allocate(OUTSIDE, requests)
        if sorted(before) != sorted(c.holdings.get(OUTSIDE, [])):
            self.state.failed.clear()  # shapes that did not fit may fit now

    def withdraw(self, job_id: str) -> None:
        """Take a queued job out (a replica of a training run that finished without it); a head
        awaiting its victims' saves gives back the room it claimed."""
        self.handover.withdraw(job_id)
        self.books.dequeue(self.state.jobs[job_id])

    def queued(self) -> int:
        return len(self.state.jobs)

    def dominant(self, job: Job) -> float:
        """The job's largest fraction of the cluster's CPUs, memory or GPUs (its DRF share)."""
        return self.state.dominant(job)

    def charge(self, job: Job) -> float:
        """What a running job counts against its domain's weight (`PlacerState.charge`)."""
        return self.state.charge(job)

    def level(self, d: str, now: float, extra: float = 0.0) -> float:
        """Domain `d`'s recent use per unit of weight (`PlacerState.level`): the fair order serves the lowest first."""
        return self.state.level(d, now, extra)

    def held(self) -> Resources:
        c = self.state.c
        return Resources.of(tuple(t - f for t, f in zip(c.total, c.free_total)))

    # one pass
    def schedule(self, now: float) -> list[tuple[str, Running]]:
        """Start what can start now; returns what happened in order: ("start" | "preempt" | "notice", run)."""
        s, log = self.state, []
        s.clock = now
        s.preempt_left = s.cfg.preempt_tries
        # who may be a victim changes with time too (saves, entitlements), not only with resources: fair-share victims
        # always, and priority victims with `preempt_keeps_progress`
        if s.cfg.preempt_keeps_progress:
            s.failed_preempt.clear()
            s.candidates.clear()
        else:
            s.failed_preempt.difference_update([k for k in s.failed_preempt if k[0] != "priority"])
        if s.entitling:
            s.entitled.update(s.usage, now)
        self.handover.hand_over(now, log)
        for jid in list(s.reserved):
            self._attempt(s.jobs[jid], now, True, log)
        if s.cfg.order == "fifo":
            self._pass_fifo(now, log)
        else:
            self._pass_fair(now, log)
        return log

    def _pass_fifo(self, now: float, log: list) -> None:
        s, tries = self.state, 0
        for job in list(islice(s.queues[""], s.cfg.scan_limit + len(s.reserved))):
            if tries >= s.cfg.scan_limit:
                break
            if job.id in s.reserved or job.id in s.awaiting:
                continue
            tries += 1
            if not self._attempt(job, now, tries == 1, log) and not s.cfg.backfill:
                break

    def _pass_fair(self, now: float, log: list) -> None:
        s, cfg = self.state, self.state.cfg
        heap = [self._heap_key(d, q[0], now) for d, q in s.queues.items() if q]
        first = {}  # head priority -> the domain the fair order serves first this pass: the only one that may reserve or keep GPUs
        for key in sorted(heap):
            first.setdefault(key[0], key[-1])
        heapq.heapify(heap)
        self.holds.begin_pass()
        tries = 0
        while heap and tries < cfg.scan_limit:
            key = heapq.heappop(heap)
            d = key[-1]
            q = s.queues[d]
            if key[0] <= -FLOOR and not s.below_floor(q[0].priority):  # its class reached the floor this pass
                heapq.heappush(heap, self._heap_key(d, q[0], now))
                continue
            placed = False
            for pos, job in enumerate(list(islice(q, cfg.domain_scan if cfg.backfill else 1))):
                if job.id in s.reserved or job.id in s.awaiting:
                    continue
                tries += 1
                if self.holds.keeps_out(job):
                    continue  # it would take GPUs kept for a blocked head ranked before it
                rank = self._heap_key(d, job, now)[0]
                if self._attempt(job, now, pos == 0, log, may_reserve=first.get(rank) == d):
                    placed = True
                    break
                if pos == 0 and first.get(rank) == d:
                    self.holds.keep_for(job, rank)
            if placed and q:
                turn = q[0].batch is not None and q[0].batch == job.batch  # a shard of the batch just started keeps its turn
                heapq.heappush(heap, key if turn else self._heap_key(d, q[0], now))
            elif not placed and not cfg.backfill:
                break

    def _heap_key(self, d: str, head: Job, now: float) -> tuple:
        rank = FLOOR + head.priority if self.state.below_floor(head.priority) else head.priority
        return (-rank, self.state.level(d, now), head.submitted, d)

    def _attempt(self, job: Job, now: float, head: bool, log: list, may_reserve: bool = True) -> bool:
        """Start `job` if it fits; if it is a head that has waited, pre-empt or reserve for it
        (`may_reserve`: its domain came first in the fair order when the pass began)."""
        s, cfg = self.state, self.state.cfg
        own = s.reserved.get(job.id, set())
        shape = s.shape(job)
        if (not own and shape in s.failed) or any(t > f for t, f in zip(job.total, s.c.free_total)):
            nodes = None
        else:
            nodes = self.policy(FreeView(s.c, blocked=self.holds.blocked(own)), job, cfg)
        if nodes is not None:
            log.append(("start", self.books.start(job, nodes, now)))
            return True
        if not own:
            s.failed.add(shape)  # it does not fit anywhere until resources come back
        if not head:
            return False
        waited = now - s.waiting_since[job.id]
        if cfg.preempt and self.preemption.preempt_for(job, now, log):
            return True
        if (may_reserve and cfg.reserve_after_s is not None and waited >= cfg.reserve_after_s and not own
                and len(s.reserved) < cfg.max_reservations):
            self.holds.reserve(job)
        return False
