"""A discrete-event model of the RL runtime: how many trajectories a second sync and async
training reach with R rollout workers and T data-parallel trainers, from measured costs.

What it models. A step consumes `groups` groups of `group_size` samples, spread over the
workers. A worker's engine decodes every sequence of the requests it runs (up to `inflight` at
once, as the runtime does) side by side: a decode step costs `gen_fixed_s` (the per-step
overhead that does not shrink with the batch) plus `gen_token_s` per live sequence; completion
lengths are drawn from the measured distribution; a finished request then costs `score_s` a
group of sandbox scoring. Training a step costs
`train_token_s` per completion token divided over T trainers, plus a ring all-reduce of the
gradients (2 (T-1)/T x `model_bytes` over `net_gbps`) and the weight broadcast to the workers
(`sync_s`). Sync: all rollouts of a step, then its update. Async: a step's requests are admitted
once the trainer is within `max_staleness` versions, exactly as the controller does, and the
trainer takes each step's groups as soon as they are all in.

Shared cores (`shared_cpu`): on one machine rollout and training time-share the cores; an
activity then progresses at its measured rate when it runs alone and at `gen_shared` /
`train_shared` of it while the other runs (measured with one thread each vs two). This is the
mode validated against the 2-core runs; the scale-out predictions give every worker and
trainer a machine of its own (rates 1). Processor sharing is simulated exactly: each running
activity holds its remaining work in solo-seconds, and rates change only at events.

Not modelled: network contention between workers, failures, partial-rollout re-prefill cost.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field


@dataclass
class Costs:
    gen_fixed_s: float  # per decode step of a request's longest sample
    gen_token_s: float  # per generated token
    train_token_s: float  # one trainer, per completion token (forward, backward, reference, optimizer)
    score_s: float = 0.0  # sandbox scoring of one group
    sync_s: float = 0.0  # publishing one version to the workers
    lengths: list[int] = field(default_factory=lambda: [100])  # completion lengths to draw from
    model_bytes: float = 540e6
    net_gbps: float = 10.0  # gradient all-reduce bandwidth between trainers
    shared_cpu: bool = False
    gen_shared: float = 1.0  # rate of generation while training runs on the same cores
    train_shared: float = 1.0
    worker_start_s: float = 0.0  # a rollout worker process's start-up (spawn, imports, model, engine) before its first request

    def allreduce_s(self, trainers: int) -> float:
        if trainers <= 1:
            return 0.0
        return 2 * (trainers - 1) / trainers * self.model_bytes * 8 / (self.net_gbps * 1e9) + 1e-3 * math.log2(trainers)


@dataclass
class Workload:
    steps: int
    groups: int  # per step
    group_size: int
    mode: str = "sync"  # "sync" or "async"
    max_staleness: int = 1
    workers: int = 1
    trainers: int = 1
    seed: int = 0
    inflight: int | None = None  # requests a worker runs at once; None: 1 + max_staleness (async), 1 (sync)
    remote_workers: bool = True  # workers are processes of their own (they pay costs.worker_start_s); False: in the trainer's process


@dataclass
class Outcome:
    wall_s: float
    trajectories: int
    trainer_busy_s: float
    rollout_busy_s: float
    staleness: list[int]

    @property
    def throughput(self) -> float:
        return self.trajectories / self.wall_s

    def summary(self) -> dict:
        return {"wall_s": self.wall_s, "trajectories_per_s": self.throughput,
                "trainer_idle_ratio": 1 - self.trainer_busy_s / self.wall_s,
                "staleness_mean": sum(self.staleness) / max(1, len(self.staleness))}


class _Sim:
    """Processor-sharing event loop over gen / train activities."""

    def __init__(self, costs: Costs, wl: Workload):
        self.c, self.wl = costs, wl
        self.rng = random.Random(wl.seed)
        self.now = 0.0
        self.active: dict[int, list] = {}  # activity id -> [kind, remaining solo-seconds, on_done, total]
        self._ids = 0
        self.busy = {"gen": 0.0, "train": 0.0}

    def start(self, kind: str, work: float, on_done) -> int:
        self._ids += 1
        self.active[self._ids] = [kind, work, on_done, work]
        return self._ids

    def cut(self, aid: int) -> float:
        """Stop an activity early; returns the solo-seconds of work it had done."""
        kind, left, _, total = self.active.pop(aid)
        return total - left

    def _rate(self, kind: str) -> float:
        if not self.c.shared_cpu:
            return 1.0
        kinds = {a[0] for a in self.active.values()}
        if kind == "gen" and "train" in kinds:
            return self.c.gen_shared
        if kind == "train" and "gen" in kinds:
            return self.c.train_shared
        return 1.0

    def run(self) -> None:
        while self.active:
            rates = {i: self._rate(a[0]) for i, a in self.active.items()}
            dt = min(a[1] / rates[i] for i, a in self.active.items())
            for j, a in self.active.items():
                a[1] -= dt * rates[j]
            for k in {a[0] for a in self.active.values()}:
                self.busy[k] += dt
            self.now += dt
            for j in [j for j, a in self.active.items() if a[1] <= 1e-12]:
                self.active.pop(j)[2]()


class _Engine:
    """One rollout worker's engine: the requests it runs decode side by side, one token per
    sequence a step, a step costing gen_fixed_s + gen_token_s x live sequences. Simulated in
    segments between two sequences finishing; a request joining mid-segment cuts it."""

    def __init__(self, sim: _Sim):
        self.sim, self.c = sim, sim.c
        self.reqs: list[list] = []  # [remaining lengths, on_done]
        self.aid, self.step_cost, self.steps = None, 0.0, 0.0

    @property
    def load(self) -> int:
        return len(self.reqs)

    def add(self, lengths: list[float], on_done) -> None:
        if self.aid is not None:
            self._advance(self.sim.cut(self.aid) / self.step_cost)
        self.reqs.append([list(lengths), on_done])
        self._segment()

    def _advance(self, steps: float) -> None:
        self.aid = None
        for r in self.reqs:
            r[0] = [x - steps for x in r[0] if x - steps > 1e-9]
        done = [r for r in self.reqs if not r[0]]
        self.reqs = [r for r in self.reqs if r[0]]
        for r in done:
            r[1]()

    def _segment(self) -> None:
        live = sum(len(r[0]) for r in self.reqs)
        if not live:
            return
        self.steps = min(x for r in self.reqs for x in r[0])
        self.step_cost = self.c.gen_fixed_s + self.c.gen_token_s * live
        self.aid = self.sim.start("gen", self.steps * self.step_cost, self._end)

    def _end(self) -> None:
        self._advance(self.steps)
        if self.aid is None:
            self._segment()


def simulate(costs: Costs, wl: Workload) -> Outcome:
    sim = _Sim(costs, wl)
    split = [len(range(w, wl.groups, wl.workers)) for w in range(wl.workers)]  # groups per worker per step
    state = {"version": 0, "trained": 0, "next": 1, "staleness": [], "pending": {}, "tokens": {}, "started": {}}
    queues: list[list] = [[] for _ in range(wl.workers)]  # per worker: heap of (step, n_groups)
    engines = [_Engine(sim) for _ in range(wl.workers)]
    s = wl.max_staleness if wl.mode == "async" else 0
    capacity = wl.inflight or (1 + s)

    def train(step: int) -> None:
        tokens = state["tokens"].pop(step)
        work = tokens * costs.train_token_s / wl.trainers + costs.allreduce_s(wl.trainers) + costs.sync_s
        state["staleness"].append(step - 1 - state["started"].pop(step))
        sim.start("train", work, lambda: trained(step))

    def trained(step: int) -> None:
        state["version"] = state["trained"] = step
        admit()
        maybe_train()

    def maybe_train() -> None:
        step = state["trained"] + 1
        if step <= wl.steps and state["pending"].get(step) == 0 and not any(a[0] == "train" for a in sim.active.values()):
            state["pending"].pop(step)
            train(step)

    def admit() -> None:
        while state["next"] <= wl.steps and state["next"] - 1 - s <= state["version"]:
            step = state["next"]
            state["next"] += 1
            state["pending"][step] = sum(1 for n in split if n)
            state["tokens"][step] = 0
            state["started"][step] = state["version"]
            for w, n in enumerate(split):
                if n:
                    heapq.heappush(queues[w], (step, n))
        for w in range(wl.workers):
            kick(w)

    def kick(w: int) -> None:
        while queues[w] and engines[w].load < capacity:
            step, n = heapq.heappop(queues[w])
            lengths = [sim.rng.choice(costs.lengths) for _ in range(n * wl.group_size)]
            state["tokens"][step] += sum(lengths)

            def generated(step=step, n=n) -> None:  # then the sandbox scores the groups
                sim.start("gen", costs.score_s * n, lambda: scored(step))

            engines[w].add(lengths, generated)

    def scored(step: int) -> None:
        state["pending"][step] -= 1
        maybe_train()
        for w in range(wl.workers):
            kick(w)

    if wl.remote_workers and costs.worker_start_s > 0:  # every worker starts at once; none serves before it is up
        sim.start("gen", costs.worker_start_s, admit)
    else:
        admit()
    sim.run()
    return Outcome(sim.now, wl.steps * wl.groups * wl.group_size, sim.busy["train"], sim.busy["gen"], state["staleness"])


def sweep(costs: Costs, steps: int, groups: int, group_size: int, workers: list[int], trainers: list[int],
          staleness: list[int], seed: int = 0) -> list[dict]:
    """Throughput of sync and async at every (workers, trainers) point; rows for a table or a plot."""
    rows = []
    for r in workers:
        for t in trainers:
            sync = simulate(costs, Workload(steps, groups, group_size, "sync", 0, r, t, seed))
            row = {"workers": r, "trainers": t, "sync_trajectories_per_s": sync.throughput}
            for k in staleness:
                a = simulate(costs, Workload(steps, groups, group_size, "async", k, r, t, seed))
                row[f"async{k}_trajectories_per_s"] = a.throughput
                row[f"async{k}_speedup"] = a.throughput / sync.throughput
            rows.append(row)
    return rows
