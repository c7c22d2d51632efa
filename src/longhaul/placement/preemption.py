"""Pre-emption: which running jobs a waiting head may evict, which of them it does evict, and
the eviction. It owns the choice of victims (`Preemption.search`, which evicts nothing) and
carries it out through the other parts: victims killed go back to their queues (`books.py`),
victims told to save hand their nodes over (`handover.py`, which also prices a victim's loss);
which heads may pre-empt, and when, is the order's (`placer.py`).

Pre-emption (`preempt`): a job that has waited `preempt_after_s` and cannot fit may evict
running pre-emptible jobs of strictly lower priority (`runtime.domains.queues.preempts`), only
if that makes it fit: victims are taken node by node, lowest priority first, then the least work
lost (held dominant share x time since they last saved, per `Job.checkpoint_every_s`), until the
job's units fit, never taking a victim whose class would fall below its `min_class_share`.
Victims go back to the head of their queue (a victim that saves on notice, once it has saved:
handover.py). A job killed `max_preemptions` times is not evicted again, so no job starves
restarting (a victim told to save keeps its work: telling it does not count); with
`preempt_keeps_progress` instead, a job killed before is a victim again only once it saved since
it restarted (no cap, no immune jobs). At most `preempt_tries` searches run a pass.

Fair-share pre-emption (`fair_preempt_after_s`): a head that has waited that long may also
evict jobs of its own priority from domains whose level per weight is above the one its domain
would reach by starting it, taking each victim only while the victim's domain stays at least
that high (no ping-pong); the most over-share domain's least costly job goes first, and with
`fair_preempt_max_loss_s` only jobs that saved at most that long ago are taken; a victim told to
save on notice (handover.py) loses its save instead, capped by `fair_preempt_max_save_s` if set.

With `entitled_preempt` the test is the estimated entitlement (entitlement.py) instead of the
level: only a head of a domain under its entitlement may evict, only jobs of domains over theirs,
each taken only while its domain stays at or above its own (no ping-pong: a victim's domain is
not under its entitlement afterwards), the one that loses the least work first. By levels alone
a domain below the water line could evict another below it, which only moves the wait.

With `instant_first` a search first weighs only the victims that would be killed (not told to
save), and all of them only if those do not make the head fit: the head starts at once instead
of waiting out a save, at the price of killing work the save would have kept.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from longhaul.placement.books import Books
from longhaul.placement.handover import Handover, per_node
from longhaul.placement.holds import Holds
from longhaul.placement.placement import FreeView, Job, Running
from longhaul.placement.state import PlacerState
from longhaul.runtime.domains.queues import preempts


class Preemption:
    def __init__(self, state: PlacerState, policy: Callable, books: Books, holds: Holds, handover: Handover):
        self.s, self.policy, self.books, self.holds, self.handover = state, policy, books, holds, handover

    def preempt_for(self, job: Job, now: float, log: list) -> bool:
        """Evict for `job`: strictly lower priorities after `preempt_after_s`; with
        `fair_preempt_after_s`, over-share domains of its own priority after that long (a head
        that may evict its peers may evict lower priorities too, and tries them first)."""
        s, cfg = self.s, self.s.cfg
        waited = now - s.waiting_since[job.id]
        if s.preempt_left <= 0:
            return False
        share = (cfg.fair_preempt_after_s is not None and waited >= cfg.fair_preempt_after_s
                 and not (cfg.entitled_preempt and not s.entitled.under(job.domain)))
        if (waited >= cfg.preempt_after_s or share) and self._evict_for(job, now, log, "priority"):
            return True
        return share and self._evict_for(job, now, log, "share")

    def _evict_for(self, job: Job, now: float, log: list, mode: str) -> bool:
        found = self.search(job, now, mode)
        if found is None:
            return False
        self._evict(job, *found, now, log)
        return True

    def search(self, job: Job, now: float, mode: str) -> tuple[list[int], list[Running]] | None:
        """The nodes `job` would run on and the victims that make it fit there (`mode`:
        "priority", lower priorities; "share", over-share domains of its own priority), or None.
        Nothing is evicted; a search that finds none is not repeated until resources change."""
        s, c = self.s, self.s.c
        key = (mode, *s.shape(job), job.priority, round(s.level(job.domain, now, s.charge(job)), 9) if mode == "share" else None)
        own = s.reserved.get(job.id, set())
        if key in s.failed_preempt and not own:
            return None
        every = self._victims(job.priority, now) if mode == "priority" else self._over_share(job, now)
        stages = [every]
        if s.cfg.instant_first:  # first among the victims that go now (killed): the head need not wait for a save
            instant = self._victims(job.priority, now, at_once=True) if mode == "priority" else self._at_once(every[0], now)
            if instant is not None:
                stages.insert(0, instant)
        nodes, chosen = None, None
        for runs, bonus, summaries, total in stages:
            if runs and all(t <= f + e for t, f, e in zip(job.total, c.free_total, total)):
                s.preempt_left -= 1
                nodes = self.policy(FreeView(c, bonus, self.holds.blocked(own), summaries), job, s.cfg)
                chosen = self._plan_victims(job, nodes, runs, now, mode) if nodes is not None else None
                if chosen is not None:
                    break
        if chosen is None:
            if not own:
                s.failed_preempt.add(key)
            return None
        return nodes, chosen

    def _evict(self, job: Job, nodes: list[int], chosen: list[Running], now: float, log: list) -> None:
        """Evict `chosen` for `job` on `nodes`: those told save first (handover.py), the others are
        killed now; `job` starts at once unless it awaits a save."""
        s, handover = self.s, self.handover
        gone, told, runs_told = {v.job.id for v in chosen}, [], set()
        for v in chosen:
            # replicas whose working peers all go too: the last one holds the only copy, it is told like a lone one
            last = v.job.replica is not None and v.job.batch not in runs_told
            if handover.told(v, now) or (last and handover.told(v, now, leaving=gone)):
                told.append(v)
                if v.job.replica is not None:
                    runs_told.add(v.job.batch)
        told_ids = {v.job.id for v in told}
        for victim in chosen:
            jid = victim.job.id
            if jid not in told_ids:
                self.books.release(jid, now)
                self.books.requeue(victim.job, now)
                log.append(("preempt", victim))
                s.kills[jid] += 1
            s.preemptions += 1
            s.evictions[jid] += 1
        if told:
            handover.tell(told, job, nodes, now, log)
        else:
            log.append(("start", self.books.start(job, nodes, now)))

    # the candidates
    def _candidates(self, runs: dict) -> tuple[dict, dict, tuple, tuple]:
        """`runs`, what evicting them all frees per node, that view's rack summaries, the total."""
        bonus: dict[int, list[int]] = {}
        for jid in runs:
            for i, u in self.s.c.holdings[jid]:
                b = bonus.setdefault(i, [0, 0, 0])
                for k in range(3):
                    b[k] += u[k]
        view = FreeView(self.s.c, bonus)
        total = tuple(sum(b[k] for b in bonus.values()) for k in range(3))
        return runs, bonus, (view.rack_max, view.rack_free), total

    def _victims(self, priority: int, now: float, at_once: bool = False) -> tuple | None:
        """Running evictable jobs of priorities below `priority` (cached until resources change,
        or for the pass with `preempt_keeps_progress`); `at_once`: only those killed, not told
        (`_at_once`; who is told changes with time, so cached for this pass's time)."""
        cache = self.s.candidates
        key = (priority, now) if at_once else priority
        if key not in cache:
            cache[key] = (self._at_once(self._victims(priority, now)[0], now) if at_once else self._candidates(
                {jid: r for p, runs in self.s.by_priority.items() if preempts(priority, p) for jid, r in runs.items()
                 if self._may_kill_again(r, now)}))
        return cache[key]

    def _at_once(self, runs: dict, now: float) -> tuple | None:
        """The candidates among `runs` that would be killed, not told to save (`instant_first`), for
        a search of their own before all of them; None if that is none or all of them (it would add nothing)."""
        some = {jid: r for jid, r in runs.items() if not self.handover.told(r, now)}
        return self._candidates(some) if some and len(some) < len(runs) else None

    def _may_kill_again(self, r: Running, now: float) -> bool:
        """With `preempt_keeps_progress`, a job killed before is a victim again only once it got on."""
        return not (self.s.cfg.preempt_keeps_progress and self.s.kills.get(r.job.id) and not self._keeps_progress(r, now))

    def _over_share(self, job: Job, now: float) -> tuple:
        """Running evictable jobs of `job`'s priority whose domains stand above the level
        `job`'s domain would reach by starting it, with at most `fair_preempt_max_loss_s` of
        unsaved work. A victim is taken only while its domain stays at or above that level
        after losing it, so two domains never evict each other back and forth."""
        s = self.s
        bar = s.level(job.domain, now, s.charge(job))
        above = ((lambda d: s.entitled.over(d, s.usage.level(d, now)) > 0) if s.cfg.entitled_preempt
                 else (lambda d: s.level(d, now) > bar))
        runs = {jid: r for jid, r in s.by_priority.get(job.priority, {}).items()
                if r.job.priority == job.priority and r.job.domain != job.domain and above(r.job.domain)
                and self._cheap(r, now)}
        return self._candidates(runs)

    def _cheap(self, r: Running, now: float) -> bool:
        """Whether `r` loses little enough to be a fair-share victim: a save of at most
        `fair_preempt_max_save_s` if it is told (handover.py), else at most `fair_preempt_max_loss_s`
        unsaved; with `preempt_keeps_progress`, only if it keeps work of this run (`_keeps_progress`)."""
        cfg = self.s.cfg
        told = self.handover.told(r, now)
        if cfg.preempt_keeps_progress and not self._keeps_progress(r, now, told):
            return False
        cap = cfg.fair_preempt_max_save_s if told and cfg.fair_preempt_max_save_s is not None else cfg.fair_preempt_max_loss_s
        return cap is None or (r.job.notice_save_s if told else self.handover.cadence_loss_s(r, now)) <= cap

    def _keeps_progress(self, r: Running, now: float, told: bool | None = None) -> bool:
        """Whether evicting `r` keeps work of its run: it is told (it saves; `told`, if known), or
        it saved since it started. A job evicted again and again under this rule still gets on."""
        return (self.handover.told(r, now) if told is None else told) or self.handover.saved_since_start(r, now)

    # the victims
    def _plan_victims(self, job: Job, nodes: list[int], runs: dict, now: float, mode: str) -> list[Running] | None:
        """The victims that make `job` fit on `nodes`, chosen node by node (lowest priority, or
        most over-share domain, first; then the least work lost); None if they do not suffice.
        Nothing is evicted here."""
        s, c = self.s, self.s.c
        need, freed = per_node(nodes, job.needs), defaultdict(lambda: [0, 0, 0])
        freed_share: dict[str, float] = defaultdict(float)  # domain -> share its chosen victims hold
        freed_class: dict[int, float] = defaultdict(float)  # priority class -> likewise
        bar = s.level(job.domain, now, s.charge(job))
        chosen: dict[str, Running] = {}
        for i, u in need.items():
            order = sorted((runs[jid] for jid in c.node_jobs[i] if jid in runs and jid not in chosen),
                           key=lambda r: self._victim_order(r, mode, now))
            while any(c.free[i][k] + freed[i][k] < u[k] for k in range(3)):
                victim = next((r for r in order if r.job.id not in chosen and self._may_evict(r, mode, bar, freed_share, freed_class, now)), None)
                if victim is None:
                    return None
                chosen[victim.job.id] = victim
                freed_share[victim.job.domain] += s.charge(victim.job)
                freed_class[victim.job.priority] += s.charge(victim.job)
                for j, held in c.holdings[victim.job.id]:
                    for k in range(3):
                        freed[j][k] += held[k]
        return list(chosen.values())

    def _victim_order(self, r: Running, mode: str, now: float) -> tuple:
        """Lowest priority first, or the most over-share domain first; then the least work lost.
        With `entitled_preempt` every candidate's domain is over its entitlement: least work lost first."""
        if mode == "priority":
            return (r.job.priority, self._loss(r, now), r.job.id)
        if self.s.cfg.entitled_preempt:
            return (self._loss(r, now), -self.s.level(r.job.domain, now), r.job.id)
        return (-self.s.level(r.job.domain, now), self._loss(r, now), r.job.id)

    def _may_evict(self, r: Running, mode: str, bar: float, freed_share: dict, freed_class: dict, now: float) -> bool:
        """Priority victims keep their class at its `min_class_share`; fair-share victims keep
        their domain at or above `bar` (no ping-pong), or with `entitled_preempt` at or above its
        entitlement."""
        s = self.s
        if mode == "priority":
            return not s.below_floor(r.job.priority, freed_class[r.job.priority] + s.charge(r.job))
        d, less = r.job.domain, -freed_share[r.job.domain] - s.charge(r.job)
        if s.cfg.entitled_preempt:
            return s.entitled.over(d, s.usage.level(d, now, less)) >= -1e-15
        return s.level(d, now, less) >= bar - 1e-12

    def _loss(self, run: Running, now: float) -> float:
        """What evicting `run` now throws away: its share x the wall seconds it loses."""
        return self.s.dominant(run.job) * self.unsaved_s(run, now)

    def unsaved_s(self, run: Running, now: float) -> float:
        """Wall seconds evicting `run` now loses: its save if it is told (`notice`, handover.py),
        else the time since it last saved (or started: loading its checkpoint is lost too). Saves
        fall every `checkpoint_every_s` of work, counted from when it began working at its pace:
        a clock from `started` would put them a load time early, and a victim the placer took
        for just saved would lose a whole interval."""
        loss = self.handover.cadence_loss_s(run, now)
        return run.job.notice_save_s if self.handover.told(run, now, loss) else loss
