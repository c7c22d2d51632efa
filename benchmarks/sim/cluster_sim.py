"""Discrete-event simulation of a cluster running a workload through a `Placer`.

Events are arrivals and finishes; every `TICK_S` seconds that saw one, and every tick while
jobs wait, the placer makes one pass (real schedulers batch their decisions too; the same for
every policy). A job
that starts first loads its checkpoint on each GPU unit (from the node's own cache at
`LOCAL_GBPS`, from a node of the same rack at `RACK_GBPS`, else from shared storage at
`REMOTE_GBPS`), then works; a gang whose checkpoint-loading units span r racks works
`1 + alpha * (r - 1)` times slower (alpha `CROSS_RACK_LARGE` for checkpoints >= 32 GB, else
`CROSS_RACK_SMALL`: weight sync and gradient traffic cross the spine). A pre-empted job keeps the
work saved at its checkpoint cadence and loses the rest, unless the placer tells it (a job that
saves on notice, `Job.notice_save_s`, handover.py): then it keeps all its work up to the notice,
holds its GPUs for the save, which counts as lost GPU time (with the wait for the pass after the
save ends: at most one tick more), and the head that evicted it starts (and loads) only after.
A placer with `split_elastic` queues a rollout batch (`Job.elastic`) as its shards, one worker
each: every shard works the batch's whole duration on its share of the episodes, from when it
starts, and the batch has waited as long as its longest-waiting shard.
A replicated training run (`Job.replica`, `WorkloadSpec.replicated_training`) queued as its
replicas shares one pool of work: it progresses at the pace of the replicas that have joined
(loaded; a replica joining working peers copies the whole state from one), every join or leave
costs the replicas working `Replica.leave_s` to regroup (lost GPU time, reported apart too), a
replica that leaves while a peer works loses nothing else, and the last one saves on notice or
falls back to the run's last save (every checkpoint interval of the whole run's pace). The run
ends when its work is done, and its replicas still queued are withdrawn; it has waited while
no replica of it ran.

Measured over [warm-up, end]:
- utilisation: time-averaged allocated fraction of GPUs and CPUs; the same over the backlogged
  hours only (the last pass left jobs waiting through at least `BACKLOGGED` of the hour: what
  the policy allocates when it has work it could not place; in an hour with nothing waiting no
  policy can allocate more); goodput: GPU time spent working (not loading, not lost to
  pre-emption) over GPU capacity;
- queueing delay of each job that arrived in the window: all its time waiting (after
  pre-emptions too); a job still waiting at the end counts with its wait so far (censored);
- fairness error per window of `FAIRNESS_HOURS` (and per hour, `fairness_error_1h`): u_d is a
  domain's GPU-share-seconds used in the window, and its demand is u_d plus what its jobs could
  have used there and did not: each job not finished when the window closes that waited in it,
  its GPU share x the time it waited in the window (all its waits there), at most its work left
  at the close (served at once, it would have run that much longer). A job that finished in the
  window got all it asked for there, however late it ran (its delay is the delay measure's).
  The entitlement t_d is the weighted water-fill (max-min fair by weight) of what its priority
  class used over the class's demands; error = sum|u_d - t_d| / sum(u), averaged over windows
  weighted by sum(u): the entitlement-weighted mean relative deviation from the weights,
  counting a misallocated GPU-second twice (once over, once under). A window in which no job
  that waited is still unfinished at the close has error 0.
  `..._across_priorities` also entitles classes in priority order first; `..._dominant` measures
  dominant shares instead of GPU shares (it counts CPU-heavy domains using idle CPUs as unfair,
  so it overstates the error when CPUs are not the bottleneck);
- `fairness_error_waits` (and `_1h`): the earlier measure, whose demand is u_d plus every
  second any of the domain's jobs waited (share x time), and `..._capped`, each wait at most the
  job's work left. Both count a job that waited and then ran in the window twice, once as its
  wait and once as its run: a 1-hour 8-GPU job that waited 3 hours asks 32 GPU-hours for 8 of
  work. So a domain whose jobs waited in a peak is entitled to capacity that only appears after
  its work is done (and that another domain's backlog then takes): a peak shared exactly by
  weight still reads as unfair (docs/scheduling.md, "The fairness measure");
- pre-emptions and the GPU-hours they lost.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field

from benchmarks.sim.fairness import FAIRNESS_HOURS, HOUR, Ledger, entitlement, hour_range, split_by_hour
from benchmarks.sim.workload import STORAGE_GBPS, TRAIN_STATE_X, DomainSpec, SimJob
from longhaul.placement.cluster import Cluster
from longhaul.placement.entitlement import water_fill  # the measure's split is the placer's estimate's
from longhaul.placement.placement import Running
from longhaul.placement.placer import Placer, PlacerConfig

LOCAL_GBPS, RACK_GBPS, REMOTE_GBPS = 20.0, 10.0, STORAGE_GBPS
CROSS_RACK_LARGE, CROSS_RACK_SMALL = 0.10, 0.02
TICK_S = 10.0  # seconds between placer passes (0: a pass after every event instant)
BACKLOGGED = 0.99  # an hour in which jobs waited this fraction of the time or more is a backlogged one


@dataclass
class _Replicated:
    """One replicated training run (`Job.replica`) queued as its replicas: the progress they share."""
    shards: int  # replicas it asks for
    work: float  # replica-seconds of work left (at full pace)
    every: float  # replica-seconds between its cadence saves
    since: float  # when `work` was last brought up to date
    idle_since: float | None  # when it last had no replica running (None: one runs)
    done: float = 0.0  # replica-seconds done
    saved: float = 0.0  # of those, done by its last save
    working: dict = field(default_factory=dict)  # replica that has joined (loaded) -> (its GPUs, its rack, when it joined)
    paused_until: float = -math.inf  # its replicas regroup (a replica joined or left) until then
    slow: float = 1.0
    token: int = 0
    delay: float = 0.0  # time it had no replica running (its queueing delay)
    finished: bool = False
    unsaved_gpu: float = 0.0  # in-window GPU time its work since its last save took (lost if the last replica is killed)
    unsaved_good: float = 0.0  # the goodput that work was credited
    clean_at: float = math.inf  # since when its work is unsaved (inf: nothing unsaved)


def _slowdown(run: Running, cluster: Cluster) -> float:
    racks = {cluster.rack_of[i] for u, i in zip(run.job.units, run.nodes) if u.loads_checkpoint}
    alpha = CROSS_RACK_LARGE if run.job.checkpoint_gb >= 32 else CROSS_RACK_SMALL
    return 1.0 + alpha * max(0, len(racks) - 1)


def _load_s(run: Running) -> float:
    speed = {"local": LOCAL_GBPS, "rack": RACK_GBPS, "remote": REMOTE_GBPS}
    return max((run.job.checkpoint_gb / speed[src] for src in run.load_from if src), default=0.0)


class Simulation:
    def __init__(self, nodes, domains: list[DomainSpec], jobs: list[SimJob], cfg: PlacerConfig, warmup_s: float, end_s: float,
                 tick_s: float = TICK_S):
        self.cluster = Cluster(nodes)
        self.placer = Placer(self.cluster, cfg, {d.name: d.weight for d in domains})
        self.domains, self.jobs = domains, {j.job.id: j for j in jobs}
        self.arrivals = sorted(jobs, key=lambda j: (j.arrival, j.job.id))
        self.warmup, self.end, self.tick = warmup_s, end_s, tick_s
        self.remaining = {j.job.id: j.work_s for j in jobs}
        self.parts: dict[str, list[str]] = {}  # job queued as shards (split_elastic) -> their ids
        self.unfinished: dict[str, int] = {}  # job -> its shards not yet finished
        self.runs: dict[str, _Replicated] = {}  # replicated training run queued as its replicas -> their shared progress
        self.live_runs: dict[str, _Replicated] = {}  # those not finished, in arrival order (every pass reports their saves)
        self.resize_gpu_s = 0.0  # GPU time replicas spent regrouping (counted in lost_gpu_s too)
        self.events: list = []  # (time, seq, job id, run token)
        self.token: dict[str, int] = {}
        self.seq = 0
        self.told: dict[str, float] = {}  # job saving on notice -> when it was told
        self.wait: dict[str, float] = defaultdict(float)
        self.queued_since: dict[str, float] = {}
        self.wait_spans: list[tuple[str, str, dict, float, float, float]] = []  # (job, domain, its shares by measure, queued at, started at, work left s)
        self.run_spans: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)  # job -> each start as (at, load s, slowdown, work left s then); the last is a running job's
        self.done_at: dict[str, float] = {}  # job -> when it finished (or was withdrawn)
        self.ledgers = {"gpu": Ledger(), "dominant": Ledger()}  # fairness measured on GPU shares, and on dominant shares
        self.gpu_alloc_s = self.cpu_alloc_s = self.goodput_gpu_s = self.lost_gpu_s = 0.0
        self.preemptions = self.finished = 0
        self.gpu_hourly: dict[int, float] = defaultdict(float)  # hour -> allocated GPU fraction (time-averaged)
        self.backlog_hourly: dict[int, float] = defaultdict(float)  # hour -> seconds of it some job waited
        self.backlog = False  # the last pass left jobs waiting (a job that arrived since has not been tried yet)
        self.clock = 0.0

    def _in_window(self, a: float, b: float) -> float:
        return max(0.0, min(b, self.end) - max(a, self.warmup))

    def _account(self, now: float) -> None:
        """Allocated GPU and CPU time since the last event (the cluster holds still in between)."""
        dt = self._in_window(self.clock, now)
        if dt:
            cpu, _, gpu = self.cluster.used_fraction()
            self.gpu_alloc_s += gpu * dt
            self.cpu_alloc_s += cpu * dt
            for hour, s in split_by_hour(max(self.clock, self.warmup), min(now, self.end)):
                self.gpu_hourly[hour] += gpu * s / HOUR
                if self.backlog:
                    self.backlog_hourly[hour] += s
        self.clock = now

    def _shares(self, job) -> dict:
        return {"gpu": job.total[2] / self.cluster.total[2], "dominant": self.placer.dominant(job)}

    def _run_of(self, job) -> _Replicated | None:
        """The replicated run `job` is a replica of (None: it is not one)."""
        return self.runs.get(job.batch) if job.replica is not None else None

    def _push(self, t: float, jid: str, token: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, jid, token))

    def _on_start(self, run: Running, now: float) -> None:
        jid = run.job.id
        rr = self._run_of(run.job)
        load, slow = (self._join_load_s(run, rr), rr.slow) if rr else (_load_s(run), _slowdown(run, self.cluster))
        run.working_from, run.pace = now + load, slow  # what the job reports: the placer reads its checkpoint times from them
        queued_at, shares = self.queued_since.pop(jid), self._shares(run.job)
        self.wait[jid] += now - queued_at
        self.wait_spans.append((jid, run.job.domain, shares, queued_at, now, self.remaining[jid]))
        self.run_spans[jid].append((now, load, slow, self.remaining[jid]))
        self.token[jid] = self.token.get(jid, 0) + 1
        if rr and rr.finished:  # requeued after its save and restarted in the same pass, though its run is done
            for m, share in shares.items():
                self.ledgers[m].change(run.job.domain, now, queued=-share)
            self.placer.release(jid, now)
            return
        if rr:  # it joins its run once loaded; the run, not the replica, finishes
            if rr.idle_since is not None:
                rr.delay += now - rr.idle_since
                rr.idle_since = None
            self._push(now + load, jid, self.token[jid])
        else:
            self._push(now + load + self.remaining[jid] * slow, jid, self.token[jid])
        for m, share in shares.items():
            self.ledgers[m].change(run.job.domain, now, held=share, queued=-share)

    def _worked(self, jid: str, now: float) -> tuple[float, float]:
        """(nominal work seconds done, the part of the run inside the window) of its run so far."""
        start, load, slow, _ = self.run_spans[jid][-1]
        return max(0.0, now - start - load) / slow, self._in_window(start, now) / max(now - start, 1e-9)

    def _on_notice(self, run: Running, now: float) -> None:
        """Told to save: all its work so far is kept; it holds its GPUs until `_on_stop`."""
        jid = run.job.id
        self.token[jid] = self.token.get(jid, 0) + 1  # its finish (or join) event is void
        self.told[jid] = now
        if self._run_of(run.job):  # it saves the run's state, if it holds the only copy
            self._leave(run, now, saves=True)
            return
        worked, frac = self._worked(jid, now)
        self.remaining[jid] -= worked
        self.goodput_gpu_s += run.job.total[2] * worked * frac

    def _on_stop(self, run: Running, now: float, preempted: bool) -> None:
        jid = run.job.id
        gpus = run.job.total[2]
        rr = self._run_of(run.job)
        if jid in self.told:  # it saved on notice: its work was kept then, the save is lost
            self.lost_gpu_s += gpus * self._in_window(self.told.pop(jid), now)
            worked, frac = 0.0, 0.0
        elif rr:  # its run's progress is the run's: a replica leaving costs its peers a regroup, the last one its unsaved work
            self.token[jid] = self.token.get(jid, 0) + 1
            self._leave(run, now, saves=not preempted)
            worked, frac = 0.0, 0.0
        else:
            worked, frac = self._worked(jid, now)
            if preempted:
                every = run.job.checkpoint_every_s
                saved = math.floor(worked / every) * every if every else 0.0
                self.remaining[jid] -= saved
                self.lost_gpu_s += gpus * (worked - saved) * frac
                worked = saved
        if preempted:
            self.queued_since[jid] = now
            if self.warmup <= now <= self.end:
                self.preemptions += 1
            if rr:
                self.remaining[jid] = rr.work / rr.shards
        else:
            self.done_at[jid] = now
            if rr is None:  # (a replica is counted finished with its run, in _run_done)
                batch = run.job.batch
                if batch is None:
                    self.finished += 1
                else:  # a job run as shards is finished when its last shard is
                    self.unfinished[batch] -= 1
                    self.finished += not self.unfinished[batch]
        self.goodput_gpu_s += gpus * worked * frac
        for m, share in self._shares(run.job).items():
            self.ledgers[m].change(run.job.domain, now, held=-share, queued=share if preempted else 0.0)
        if rr and preempted and rr.finished and jid in self.placer.jobs:  # its run finished while it saved: it does not queue again
            self._withdraw(run.job, now)

    # replicated training runs (Job.replica) queued as their replicas
    def _join_load_s(self, run: Running, rr: _Replicated) -> float:
        """A replica joining running peers copies the whole state from one (from the same rack at
        `RACK_GBPS`, else at `REMOTE_GBPS`); the first loads the weights like any job."""
        if not rr.working:
            return _load_s(run)
        rack = self.cluster.rack_of[run.nodes[0]]
        near = any(r == rack for _, r, _ in rr.working.values())
        return TRAIN_STATE_X * run.job.checkpoint_gb / (RACK_GBPS if near else REMOTE_GBPS)

    def _settle(self, rr: _Replicated, now: float) -> None:
        """Bring the run's work up to `now`: its joined replicas worked, except while they regrouped."""
        gpus, n = sum(g for g, _, _ in rr.working.values()), len(rr.working)
        pause_end = min(now, max(rr.since, rr.paused_until))
        if n and pause_end > rr.since:
            lost = gpus * self._in_window(rr.since, pause_end)
            self.lost_gpu_s += lost
            self.resize_gpu_s += lost
        if n and now > pause_end:
            step = min(rr.work, n * (now - pause_end) / rr.slow)
            rr.work -= step
            rr.done += step
            end = pause_end + step * rr.slow / n  # `now`, unless its work ran out first (a done event not yet handled)
            good = gpus * self._in_window(pause_end, end) / rr.slow
            self.goodput_gpu_s += good
            saved = math.floor(rr.done / rr.every) * rr.every
            if saved > rr.saved:  # a cadence save fell in this stretch: only the work after it is unsaved
                rr.saved, rr.unsaved_gpu, rr.unsaved_good = saved, 0.0, 0.0
                rr.clean_at = pause_end = end - (rr.done - saved) * rr.slow / n
                good = gpus * self._in_window(pause_end, end) / rr.slow
            rr.unsaved_gpu += good * rr.slow
            rr.unsaved_good += good
        rr.since = now

    def _report_saves(self, now: float) -> None:
        """Replicas report their run's last save (the placer prices evicting the last one by it)."""
        for batch, rr in self.live_runs.items():
            if rr.working:
                self._settle(rr, now)
            for p in self.parts[batch]:
                if p in self.placer.running:
                    self.placer.running[p].saved_at = rr.clean_at

    def _reschedule(self, batch: str, now: float) -> None:
        rr = self.runs[batch]
        rr.token += 1
        if rr.working:
            self._push(max(now, rr.paused_until) + rr.work * rr.slow / len(rr.working), batch, rr.token)

    def _regroup(self, rr: _Replicated, run: Running, now: float, pause: bool = True) -> None:
        """Its replicas changed: they regroup for the replica's `leave_s`, at the pace of their racks."""
        if rr.working and pause:
            rr.paused_until = max(rr.paused_until, now + run.job.replica.leave_s)
        racks = {r for _, r, _ in rr.working.values()}
        alpha = CROSS_RACK_LARGE if run.job.checkpoint_gb >= 32 else CROSS_RACK_SMALL
        rr.slow = 1.0 + alpha * max(0, len(racks) - 1)

    def _join(self, run: Running, now: float) -> None:
        rr = self.runs[run.job.batch]
        self._settle(rr, now)
        peers = any(t < now for _, _, t in rr.working.values())  # replicas that join together form the group together
        if not rr.working:  # the first: the run's work is unsaved from its start (its load is lost too, as a gang's)
            rr.clean_at = run.started
        rr.working[run.job.id] = (run.job.total[2], self.cluster.rack_of[run.nodes[0]], now)
        self._regroup(rr, run, now, pause=peers)
        self._reschedule(run.job.batch, now)

    def _leave(self, run: Running, now: float, saves: bool) -> None:
        """A replica stops working (pre-empted, or told and saving): its peers regroup; if it was
        the last one, its run keeps its work if it saves, else falls back to its last save."""
        rr = self.runs[run.job.batch]
        self._settle(rr, now)
        if rr.working.pop(run.job.id, None) is not None:
            self._regroup(rr, run, now)
            if not rr.working and not saves:  # the only copy is gone: back to its last save
                self.lost_gpu_s += rr.unsaved_gpu
                self.goodput_gpu_s -= rr.unsaved_good
                rr.work += rr.done - rr.saved
                rr.done = rr.saved
            elif not rr.working:
                rr.saved = rr.done
            if not rr.working:
                rr.paused_until, rr.unsaved_gpu, rr.unsaved_good, rr.clean_at = -math.inf, 0.0, 0.0, math.inf
        if not any(p in self.placer.running for p in self.parts[run.job.batch]):
            rr.idle_since = now
        self._reschedule(run.job.batch, now)

    def _run_done(self, batch: str, now: float) -> None:
        """The run's work is done: its replicas stop, those still queued are withdrawn."""
        rr = self.runs[batch]
        self._settle(rr, now)
        rr.finished, rr.work = True, 0.0
        del self.live_runs[batch]
        self.finished += 1
        for p in self.parts[batch]:
            if p in self.placer.running:
                self._on_stop(self.placer.release(p, now), now, preempted=False)
            elif p in self.placer.jobs:
                self._withdraw(self.placer.jobs[p], now)
        rr.idle_since = None

    def _withdraw(self, job, now: float) -> None:
        self.placer.withdraw(job.id)
        queued_at = self.queued_since.pop(job.id)
        self.wait[job.id] += now - queued_at
        shares = self._shares(job)
        self.wait_spans.append((job.id, job.domain, shares, queued_at, now, self.remaining[job.id]))
        self.done_at[job.id] = now
        for m, share in shares.items():
            self.ledgers[m].change(job.domain, now, queued=-share)

    def _arrive(self, sj: SimJob, now: float) -> None:
        parts = self.placer.submit(sj.job, now)
        if parts != (sj.job,):  # queued as shards (split_elastic): each does the whole job's work on its share
            self.parts[sj.job.id], self.unfinished[sj.job.id] = [p.id for p in parts], len(parts)
            del self.remaining[sj.job.id]
            for p in parts:
                self.jobs[p.id], self.remaining[p.id] = SimJob(p, sj.arrival, sj.work_s, sj.kind), sj.work_s
            if sj.job.replica is not None:  # its replicas share one run's work
                every = (sj.job.checkpoint_every_s or math.inf) * len(parts)
                self.runs[sj.job.id] = _Replicated(len(parts), sj.work_s * len(parts), every, now, now)
                self.live_runs[sj.job.id] = self.runs[sj.job.id]
        for p in parts:
            self.queued_since[p.id] = now
            for m, share in self._shares(p).items():
                self.ledgers[m].change(p.domain, now, queued=share)

    def _next_time(self, k: int) -> float:
        t_arr = self.arrivals[k].arrival if k < len(self.arrivals) else math.inf
        return min(t_arr, self.events[0][0] if self.events else math.inf)

    def run(self, progress=None) -> dict:
        """Replay the workload; the placer makes one pass at each tick that saw an event."""
        k, last = 0, -math.inf
        while k < len(self.arrivals) or self.events or self.placer.queued() or self.placer.stopping:
            first = self._next_time(k)
            now = math.ceil(first / self.tick) * self.tick if self.tick and first < math.inf else first
            if self.tick and (self.placer.queued() or self.placer.stopping):  # waiting jobs: a pass every tick (grace periods run out between events)
                now = min(now, last + self.tick)
            if now > self.end or now == math.inf:
                break
            last = now
            while (t := self._next_time(k)) <= now:  # every arrival and finish up to this pass, in time order
                self._account(t)
                if k < len(self.arrivals) and self.arrivals[k].arrival == t:
                    self._arrive(self.arrivals[k], t)
                    k += 1
                else:
                    _, _, jid, tok = heapq.heappop(self.events)
                    if jid in self.runs:  # a replicated run's work is done
                        if self.runs[jid].token == tok and not self.runs[jid].finished:
                            self._run_done(jid, t)
                    elif self.token.get(jid) == tok and jid in self.placer.running:
                        run = self.placer.running[jid]
                        if self._run_of(run.job):  # a replica loaded: it joins
                            self._join(run, t)
                        else:
                            self._on_stop(self.placer.release(jid, t), t, preempted=False)
            self._account(now)
            self._report_saves(now)
            for what, run in self.placer.schedule(now):
                if what == "start":
                    self._on_start(run, now)
                elif what == "notice":
                    self._on_notice(run, now)
                else:
                    self._on_stop(run, now, preempted=True)
            self.backlog = self.placer.queued() > 0
            if progress is not None:
                progress(now)
        self._account(self.end)
        for rr in self.live_runs.values():  # work done so far by replicated runs still running at the end
            self._settle(rr, self.end)
        for jid, run in self.placer.running.items():  # work done so far by jobs still running at the end
            if self._run_of(run.job):
                continue
            worked, frac = self._worked(jid, self.end)
            self.goodput_gpu_s += run.job.total[2] * worked * frac
        return self.report()

    def jobs_of(self, ids) -> set[str]:
        """The jobs these placer ids belong to (a shard's job, or the id itself)."""
        return {self.jobs[j].job.batch or j for j in ids}

    def _delays(self) -> dict[int | None, list[float]]:
        """Sorted waits of the jobs that arrived in the window, all (key None) and by priority; a
        job run as shards waited as long as its shard that waited longest."""
        out: dict = defaultdict(list)
        for sj in self.arrivals:
            if not (self.warmup <= sj.arrival <= self.end):
                continue
            if (rr := self.runs.get(sj.job.id)) is not None:  # a replicated run waited while no replica of it ran
                delay = rr.delay + (self.end - rr.idle_since if rr.idle_since is not None else 0.0)
            else:
                delay = max(self.wait[j] + (self.end - self.queued_since[j] if j in self.queued_since else 0.0)
                            for j in self.parts.get(sj.job.id, (sj.job.id,)))
            out[None].append(delay)
            out[sj.job.priority].append(delay)
        return {k: sorted(v) for k, v in out.items()}

    def _spans(self) -> list[tuple[str, str, dict, float, float, float]]:
        """Every wait as (job, domain, its shares by measure, queued at, ended at, work left s); a
        job still waiting ends at the end."""
        return self.wait_spans + [(j, self.jobs[j].job.domain, self._shares(self.jobs[j].job), t0, self.end, self.remaining[j])
                                  for j, t0 in self.queued_since.items()]

    def _capped_wanted(self) -> dict:
        """hour -> domain -> GPU-share-seconds waited, each wait counted only as long as the job's
        work left: had it started when it queued, it would have been done by then."""
        wanted: dict = defaultdict(lambda: defaultdict(float))
        for _, d, shares, t0, t1, left in self._spans():
            for hour, s in split_by_hour(t0, min(t1, t0 + left, self.end)):
                wanted[hour][d] += shares["gpu"] * s
        return wanted

    def _waits(self) -> tuple[dict, dict]:
        """(hour -> the jobs that waited in it, job -> (its domain, its shares, its waits as
        (queued at, ended at, work left s)))."""
        in_hour: dict = defaultdict(set)
        of: dict = {}
        for j, d, shares, t0, t1, left in self._spans():
            if t1 > t0:
                of.setdefault(j, (d, shares, []))[2].append((t0, t1, left))
                for hour in hour_range(t0, t1):
                    in_hour[hour].add(j)
        return in_hour, of

    def _left_at(self, jid: str, t: float, waits: list) -> float:
        """Work seconds `jid` had left at `t` (unfinished then): its work when it queued if it was
        waiting up to `t`, else its work at its last start less what it did since."""
        for t0, t1, left in waits:
            if t0 < t <= t1:
                return left
        start, load, slow, left = next((r for r in reversed(self.run_spans[jid]) if r[0] < t), (t, 0.0, 1.0, self.remaining[jid]))
        return max(0.0, left - max(0.0, t - start - load) / slow)

    def _unmet(self, measure: str, t0_w: float, t1_w: float, waits: tuple[dict, dict]) -> dict[str, float]:
        """domain -> share-seconds its jobs could have used in [t0_w, t1_w) and did not: each job
        unfinished at t1_w that waited in the window, its share x the time it waited there, at
        most its work left at t1_w (served at once, it would have run that much longer)."""
        in_hour, of = waits
        out: dict[str, float] = defaultdict(float)
        for jid in set().union(*(in_hour.get(h, ()) for h in hour_range(t0_w, t1_w))):
            if self.done_at.get(jid, math.inf) <= t1_w:
                continue
            domain, shares, spans = of[jid]
            waited = sum(max(0.0, min(t1, t1_w) - max(t0, t0_w)) for t0, t1, _ in spans)
            if waited > 0:
                out[domain] += shares[measure] * min(waited, self._left_at(jid, t1_w, spans))
        return out

    def _fairness(self, hours: int, across_priorities: bool = False, measure: str = "gpu", demand: str = "unmet",
                  waits: tuple[dict, dict] | None = None) -> tuple[float, float, list[float]]:
        """(mean error weighted by use, worst window, per-window errors) over windows of `hours`.
        Within priorities (the placer's rule: weights share a priority class), each class's used
        capacity is split by weight over its own demands; across priorities, classes are
        entitled in priority order first. A domain's demand is what it used plus, with
        `demand="unmet"`, what its jobs could have used in the window and did not (`_unmet`;
        `waits`: `_waits()`, if already built); with "waits", every second any of its jobs waited
        (share x time, the earlier measure, which counts a job that waited and then ran in the
        window twice); "capped": the same, each wait at most the job's work left (GPU shares only)."""
        ledger = self.ledgers[measure]
        for d in list(ledger.held):
            ledger.advance(d, self.end)
        assert demand != "capped" or measure == "gpu", "the capped demand is in GPU shares"
        if demand == "unmet":
            waits = waits or self._waits()
        else:
            wanted_by_hour = self._capped_wanted() if demand == "capped" else ledger.wanted
        weight = {d.name: d.weight for d in self.domains}
        prio = {d.name: d.priority for d in self.domains}
        measured = hour_range(self.warmup, self.end)
        errors, total_used, per_window = 0.0, 0.0, []
        for start in measured[::hours]:
            stop = min(start + hours, measured.stop)
            used = defaultdict(float)
            for hour in range(start, stop):
                for d, v in ledger.used[hour].items():
                    used[d] += v
            if demand == "unmet":
                wanted = self._unmet(measure, start * HOUR, min(stop * HOUR, self.end), waits)
            else:
                wanted = defaultdict(float)
                for hour in range(start, stop):
                    for d, v in wanted_by_hour[hour].items():
                        wanted[d] += v
            cap = sum(used.values())
            if cap <= 0:
                continue
            asked = {d: used[d] + wanted[d] for d in set(used) | set(wanted)}
            if across_priorities:
                target = entitlement(cap, asked, weight, prio)
            else:
                target = {}
                for p in {prio[d] for d in asked}:
                    cls = {d: v for d, v in asked.items() if prio[d] == p}
                    target.update(water_fill(sum(used[d] for d in cls), cls, weight))
            err = sum(abs(used[d] - target[d]) for d in asked) / cap
            per_window.append(err)
            errors += err * cap
            total_used += cap
        return errors / max(total_used, 1e-12), max(per_window, default=0.0), per_window

    def report(self) -> dict:
        window = self.end - self.warmup
        cap_gpu = self.cluster.total[2]
        by = self._delays()
        delays = by.get(None, [])
        pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0
        waits = self._waits()  # the corrected measure's index of every wait, built once for its four figures
        fair, fair_max, _ = self._fairness(FAIRNESS_HOURS, waits=waits)
        fair_p, fair_p_max, _ = self._fairness(FAIRNESS_HOURS, across_priorities=True, waits=waits)
        fair_1h, fair_1h_max, hourly = self._fairness(1, waits=waits)
        fair_dom, _, _ = self._fairness(FAIRNESS_HOURS, measure="dominant", waits=waits)
        fair_waits, fair_waits_max, _ = self._fairness(FAIRNESS_HOURS, demand="waits")
        fair_waits_1h, _, _ = self._fairness(1, demand="waits")
        fair_capped, fair_capped_max, _ = self._fairness(FAIRNESS_HOURS, demand="capped")
        hours = hour_range(self.warmup, self.end)
        backlogged_hourly = [self.backlog_hourly.get(h, 0.0) >= BACKLOGGED * HOUR for h in hours]
        backlogged = [self.gpu_hourly.get(h, 0.0) for h, b in zip(hours, backlogged_hourly) if b]
        return {"gpu_utilisation": self.gpu_alloc_s / window, "cpu_utilisation": self.cpu_alloc_s / window,
                "gpu_utilisation_backlogged": sum(backlogged) / len(backlogged) if backlogged else None, "backlogged_hours": len(backlogged),
                "backlogged_hourly": backlogged_hourly,
                "gpu_goodput": self.goodput_gpu_s / (cap_gpu * window), "delay_p50_s": pct(delays, 0.50),
                "delay_p90_s": pct(delays, 0.90), "delay_p99_s": pct(delays, 0.99), "delay_mean_s": sum(delays) / max(len(delays), 1),
                "delay_p99_by_priority_s": {str(p): pct(v, 0.99) for p, v in sorted((k, v) for k, v in by.items() if k is not None)},
                "delay_quantiles_s": [pct(delays, q / 100) for q in range(101)],
                "fairness_error": fair, "fairness_error_worst_window": fair_max, "fairness_window_hours": FAIRNESS_HOURS,
                "fairness_error_1h": fair_1h, "fairness_error_1h_worst": fair_1h_max, "fairness_hourly": hourly,
                "fairness_error_across_priorities": fair_p, "fairness_error_across_priorities_worst_window": fair_p_max,
                "fairness_error_dominant": fair_dom, "fairness_error_waits": fair_waits, "fairness_error_waits_worst_window": fair_waits_max,
                "fairness_error_waits_1h": fair_waits_1h, "fairness_error_capped": fair_capped, "fairness_error_capped_worst_window": fair_capped_max,
                "gpu_utilisation_hourly": [self.gpu_hourly.get(h, 0.0) for h in hours],
                "preemptions": self.preemptions, "preempted_gpu_hours_lost": self.lost_gpu_s / HOUR,
                "replicas_regroup_gpu_hours": self.resize_gpu_s / HOUR,
                "evictions_most_of_one_job": max(self.placer.evictions.values(), default=0),
                "kills_most_of_one_job": max(self.placer.kills.values(), default=0),
                "jobs_evicted_3_times_or_more": sum(n >= 3 for n in self.placer.evictions.values()), "jobs_in_window": len(delays),
                "jobs_finished": self.finished, "jobs_waiting_at_end": len(self.jobs_of([*self.placer.jobs, *self.placer.stopping]))}


def simulate(nodes, domains, jobs, cfg: PlacerConfig, warmup_s: float, end_s: float, progress=None, tick_s: float = TICK_S) -> dict:
    return Simulation(nodes, domains, jobs, cfg, warmup_s, end_s, tick_s).run(progress)
