"""Pre-emption with notice: how a victim that saves on notice hands its nodes over to the head
that evicted it, and what evicting a running job costs (whether it is told, how much work it
loses). It owns the handover and those costs; which victims are taken is `preemption.py`'s,
the moves between queued and running `books.py`'s, the ledger `cluster.py`'s.

A job with `Job.notice_save_s` (a training run that checkpoints on SIGTERM and exits, like a
Kubernetes pod in its grace period or a Slurm job with `--signal`) is told instead of killed,
when that loses less than killing it (with `notice`): it keeps all its work, and loses
the save, during which it holds its resources and does no work. So the handover:

1. at the pre-emption the victim is *told*: it leaves `running` (it is no longer evictable and
   no longer counts as its domain's use) for `stopping` until now + `notice_save_s`, and keeps
   its allocation in the ledger; the head leaves nothing: it stays at the head of its queue,
   marked `awaiting`, and *claims* under its own id what its units need on its nodes beyond what
   its notified victims hold there (free now: the victims' plan covered it), so nothing else
   takes that room; it neither pre-empts nor reserves again meanwhile;
2. at the first pass at or after a save ends, the victim is released and requeued ("preempt" in
   the pass log; "notice" when it was told), and its head claims the room it gave back; once all
   of a head's victims are released, the head takes its nodes whole ("start") and only then
   loads its checkpoint.

No node is ever over capacity during a handover: the victims hold what they held, the claim is
taken from what is free, and at the start the victims' room and the claim add up to at least
what the head needs on each node. If they no longer do (a victim released early and its room
went to another job), the head is an ordinary waiting head again. A victim still loading its
checkpoint has nothing new to save and is killed at once, as are victims that would lose less
that way (they saved a moment ago); so are all victims with `notice` off. A replica of a training run
(`Job.replica`) whose peers work is killed too: they hold the whole state, so it has nothing to
save, and evicting it costs their regroup, `Replica.leave_s` each.
"""

from __future__ import annotations

from longhaul.placement.books import Books
from longhaul.placement.cluster import Resources
from longhaul.placement.holds import Holds
from longhaul.placement.placement import Job, Running
from longhaul.placement.state import PlacerState


def per_node(nodes: list[int], needs: list[tuple[int, int, int]]) -> dict[int, list[int]]:
    """What units with `needs` placed on `nodes` take on each node, in ledger units."""
    out: dict[int, list[int]] = {}
    for i, u in zip(nodes, needs):
        acc = out.setdefault(i, [0, 0, 0])
        for k in range(3):
            acc[k] += u[k]
    return out


class Handover:
    def __init__(self, state: PlacerState, books: Books, holds: Holds):
        self.s, self.books, self.holds = state, books, holds

    # what evicting a run costs
    def with_peers(self, run: Running, now: float, leaving=()) -> int:
        """How many replicas of `run`'s training run (`Job.replica`) work (loaded) beside it, not
        counting those `leaving` with it: its peers hold the whole state, so evicting it costs only
        a regroup (`Replica.leave_s`). One started in this pass has not loaded, whatever it reports."""
        if run.job.replica is None:
            return 0
        running = self.s.running
        return sum(p != run.job.id and p not in leaving and running[p].started < now and self._begun(running[p]) <= now
                   for p in self.s.replicas_running.get(run.job.batch, ()))

    def cadence_loss_s(self, run: Running, now: float, leaving=()) -> float:
        """Wall seconds since `run` last saved at its cadence (or started: a load is lost too); a
        replica whose peers work loses only their regroup (they keep the state), counted in its own share."""
        if peers := self.with_peers(run, now, leaving):  # they all regroup: the leave counts once for each of them
            return run.job.replica.leave_s * peers
        if run.saved_at is not None:  # its run reports when it last saved (a replica: the run's saves, not its own clock)
            return now - (run.started if now < self._begun(run) else run.saved_at)
        every, work = run.job.checkpoint_every_s, self._worked_s(run, now)
        if not every or work < every:
            return now - run.started
        return (work % every) * run.pace

    def saved_since_start(self, run: Running, now: float) -> bool:
        """Whether `run` saved since it started (or its working peers keep its work)."""
        if self.with_peers(run, now):  # its peers keep its work
            return True
        if run.saved_at is not None:
            return run.started < run.saved_at <= now
        every = run.job.checkpoint_every_s
        return bool(every) and self._worked_s(run, now) >= every

    def _worked_s(self, run: Running, now: float) -> float:
        """Seconds of work `run` has done since it began working (after its load), at its pace."""
        return max(0.0, now - self._begun(run)) / run.pace

    @staticmethod
    def _begun(run: Running) -> float:
        return run.started if run.working_from is None else run.working_from

    def told(self, run: Running, now: float, loss: float | None = None, leaving=()) -> bool:
        """Whether evicting `run` now means telling it: it saves on notice, has begun working, and
        the save loses less than killing it (`loss`: its `cadence_loss_s`, if known)."""
        save = run.job.notice_save_s
        return (self.s.cfg.notice and save is not None and now > self._begun(run) and not self.with_peers(run, now, leaving)
                and save < (self.cadence_loss_s(run, now, leaving) if loss is None else loss))

    # the handover
    def tell(self, victims: list[Running], head: Job, nodes: list[int], now: float, log: list) -> None:
        """Tell `victims` to save and exit; `head` awaits them on `nodes`, claiming the rest of what it needs there."""
        ready, ids = now, [r.job.id for r in victims]
        for run in victims:
            self.books.leave(run.job.id, now)
            self.s.stopping[run.job.id] = (run, now + run.job.notice_save_s)
            ready = max(ready, now + run.job.notice_save_s)
            log.append(("notice", run))
        self._claim(head, nodes, ids)
        self.holds.drop(head.id)  # it has its nodes: its drained ones are open again
        self.s.awaiting[head.id] = (list(nodes), ready, ids)

    def _claim(self, head: Job, nodes: list[int], saving: list[str]) -> None:
        """Take for `head` what its units need on `nodes` beyond what its `saving` victims hold
        there. It is free: the victims' plan covered the need, and a victim that has saved since
        gave its room back in the same pass."""
        c, need = self.s.c, per_node(nodes, head.needs)
        for jid in saving:
            for i, held in c.holdings[jid]:
                if i in need:
                    need[i] = [max(0, need[i][k] - held[k]) for k in range(3)]
        claim = [(i, Resources.of(tuple(u))) for i, u in need.items() if any(u)]
        if claim:
            c.allocate(head.id, claim)

    def hand_over(self, now: float, log: list) -> None:
        """Release the told victims whose save has ended (back in their queues); a head whose
        victims have all saved starts, one still waiting for some claims the room the others gave back."""
        s, saved = self.s, set()
        for jid, (run, until) in sorted(s.stopping.items(), key=lambda kv: (kv[1][1], kv[0])):
            if until <= now:
                del s.stopping[jid]
                s.c.release(jid)
                s.failed.clear()
                s.candidates.clear()
                s.failed_preempt.clear()
                self.books.requeue(run.job, now)
                saved.add(jid)
                log.append(("preempt", run))
        for jid, (nodes, ready, victims) in list(s.awaiting.items()):
            if not saved.intersection(victims):
                continue
            s.c.release(jid)  # its claim
            job, saving = s.jobs[jid], [v for v in victims if v in s.stopping]
            if saving:
                self._claim(job, nodes, saving)
                continue
            del s.awaiting[jid]
            if all(s.c.fits(i, u) for i, u in per_node(nodes, job.needs).items()):
                log.append(("start", self.books.start(job, nodes, now)))

    def withdraw(self, head_id: str) -> None:
        """A queued head leaves: if it awaits its victims' saves, it gives back the room it claimed."""
        if head_id in self.s.awaiting:
            del self.s.awaiting[head_id]
            self.s.c.release(head_id)
            self.s.failed.clear()
