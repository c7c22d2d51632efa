"""The placer's books: every move of a job between queued, running and saving, and what each
move updates (the queues, the ledger, the use charged to its domain and class, the pre-emptible
jobs by priority, the replicas running, the caches that resources coming back invalidate).
It owns those moves; which job moves when is the other parts' (`placer.py` starts jobs,
`preemption.py` evicts them, `handover.py` takes told victims out and back).

Queues: one per domain (`order: fair`) or one for all (`fifo`). A domain's queue is in
submission order, or with `queue_order: smallest` by GPUs asked (then age, then dominant share),
so the shards of one batch stay together. A victim goes back to the head of its queue (fifo: to
its place in submission order; `smallest`: to its place by size).
"""

from __future__ import annotations

import bisect

from longhaul.placement.holds import Holds
from longhaul.placement.placement import Job, Running
from longhaul.placement.state import PlacerState


class Books:
    def __init__(self, state: PlacerState, holds: Holds):
        self.s, self.holds = state, holds

    # queued
    def key(self, job: Job) -> str:
        """The queue `job` waits in."""
        return job.domain if self.s.cfg.order == "fair" else ""

    def enqueue(self, job: Job, now: float) -> None:
        """Queue a job submitted at `now`: at the end of its queue, or by size (`queue_order: smallest`)."""
        if self.s.cfg.order == "fair" and self.s.cfg.queue_order == "smallest":
            self._insert(job)
        else:
            self.s.queues[self.key(job)].append(job)
        self._wait(job, now)

    def requeue(self, job: Job, now: float) -> None:
        """Queue a job that was evicted at `now`, ahead of those that never ran."""
        if self.s.cfg.order == "fifo":  # back in submission order
            q = self.s.queues[""]
            pos = next((k for k, j in enumerate(q) if j.submitted > job.submitted), len(q))
            q.insert(pos, job)
        elif self.s.cfg.queue_order == "smallest":
            self._insert(job)
        else:
            self.s.queues[job.domain].appendleft(job)
        self._wait(job, now)

    def _wait(self, job: Job, now: float) -> None:
        s = self.s
        s.jobs[job.id] = job
        s.waiting_since[job.id] = now
        if s.entitling:
            s.entitled.want(job.domain, job.priority, s.charge(job), now)

    def _insert(self, job: Job) -> None:
        """Into its domain's queue by size: fewest GPUs, then oldest, then smallest dominant share."""
        q = self.s.queues[job.domain]
        q.insert(bisect.bisect_right(q, self._size(job), key=self._size), job)

    def _size(self, job: Job) -> tuple:
        return (job.total[2], job.submitted, self.s.dominant(job))

    def dequeue(self, job: Job) -> None:
        """Take `job` out of its queue (it starts, or is withdrawn); its reservation ends."""
        s = self.s
        s.queues[self.key(job)].remove(job)
        del s.jobs[job.id]
        s.waiting_since.pop(job.id, None)
        if s.entitling:
            s.entitled.unwant(job.domain, s.charge(job), s.clock)
        if self.holds.drop(job.id):
            s.failed.clear()  # its drained nodes are open to everyone again

    # running
    def start(self, job: Job, nodes: list[int], now: float) -> Running:
        """Start queued `job` with its units on `nodes` (they have room: the ledger refuses otherwise)."""
        s, c = self.s, self.s.c
        load = []
        for unit, i in zip(job.units, nodes):
            if not (unit.loads_checkpoint and job.checkpoint_gb > 0):
                load.append("")
            elif c.has_checkpoint(i, job.checkpoint):
                load.append("local")
            else:
                load.append("rack" if any(c.rack_of[j] == c.rack_of[i] for j in c.cached_on.get(job.checkpoint, ())) else "remote")
        c.allocate(job.id, [(i, u.needs) for i, u in zip(nodes, job.units)])
        for unit, i in zip(job.units, nodes):
            if unit.loads_checkpoint:
                c.note_checkpoint(i, job.checkpoint)
        self.dequeue(job)
        run = Running(job, list(nodes), now, load)
        s.running[job.id] = run
        self._count_replica(job, +1)
        if s.evictable(job):
            s.by_priority[job.priority][job.id] = run
        self._account(job, +1, now)
        return run

    def release(self, job_id: str, now: float) -> Running:
        """Running job `job_id` ended at `now` (finished, or killed): its resources go back."""
        run = self.leave(job_id, now)
        self.s.c.release(job_id)
        self.s.failed.clear()
        return run

    def leave(self, job_id: str, now: float) -> Running:
        """Running job `job_id` stops running at `now`: it no longer counts as its domain's use
        nor is evictable, but keeps its resources in the ledger (a told victim saving)."""
        s = self.s
        run = s.running.pop(job_id)
        self._count_replica(run.job, -1)
        s.by_priority[run.job.priority].pop(job_id, None)
        self._account(run.job, -1, now)
        return run

    def _account(self, job: Job, sign: int, now: float) -> None:
        s = self.s
        (s.usage.acquire if sign > 0 else s.usage.release)(job.domain, s.charge(job), now)
        s.class_held[job.priority] += sign * s.charge(job)
        s.candidates.clear()
        s.failed_preempt.clear()

    def _count_replica(self, job: Job, sign: int) -> None:
        if job.replica is not None and job.batch is not None:
            running = self.s.replicas_running[job.batch]
            running.add(job.id) if sign > 0 else running.discard(job.id)
            if not running:
                del self.s.replicas_running[job.batch]
