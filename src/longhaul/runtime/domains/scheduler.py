"""The task scheduler of a joint multi-domain run: which (domain, task) pairs go into the next
rollout batch, fed back by the outcomes of the episodes.

    sched = TaskScheduler.from_config(cfg.domains, cfg.scheduling, seed=cfg.seed, group_size=G)
    draws = sched.next_tasks(P)            # [(domain_name, task)], each task once, G episodes each
    sched.record([Outcome(d, task_id, reward, passed, tokens, sandbox_s), ...])
    log.write(step, {**step_metrics, **sched.metrics()})
    state = sched.state_dict()             # JSON-able; load_state_dict continues bit for bit

How weights, priorities and budgets interact (the rules are `queues`'s):
1. Priority first: a slot goes to the highest priority among the domains that can be drawn now.
2. Weights within a priority: slots are shared in proportion to the weights (`mixing`).
3. Budgets: a domain whose episode budget would be exceeded by one more group (counting
   groups in flight) or whose token budget is reached is no longer drawn; its share passes to
   the other domains of its priority, and when a whole priority is spent, to the next one.
   Token budgets are soft by at most the groups in flight when they run out.
4. Curriculum: inside a domain the task is drawn by its curriculum policy's weights; a task in
   flight is not drawn again until all its episodes are recorded (or `cancel`led).
`next_tasks` returns fewer than asked when fewer can be drawn, and [] once `exhausted`.

The scheduler never touches models or sandboxes; placement on machines is `longhaul.placement`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

from longhaul.errors import LonghaulError
from longhaul.runtime.domains.curriculum import in_band
from longhaul.runtime.domains.domains import Domain, DomainConfig, SchedulingConfig, build_domains
from longhaul.runtime.domains.metrics import DomainMetrics
from longhaul.runtime.domains.queues import DomainQueue, FairShare, preempts


class Draw(NamedTuple):
    domain: str
    task: object


@dataclass(frozen=True)
class Outcome:
    """One finished episode, as the scheduler needs it."""
    domain: str
    task_id: str
    reward: float  # the verifier's reward (before the domain's shaping)
    passed: bool
    tokens: int = 0  # prompt + completion tokens of the episode
    sandbox_s: float = 0.0  # seconds the episode spent in the sandbox (tool calls and verification)
    infra_error: bool = False  # the episode broke for infrastructure reasons: no outcome, no episode budget
    guided: bool = False  # an oracle demonstration (rollout.guidance): it ends its draw and says nothing of the task's difficulty

    @classmethod
    def from_trajectory(cls, domain: str, traj, sandbox_s: float | None = None) -> "Outcome":
        """From a `Trajectory`: tokens are every turn's prompt + completion; sandbox time is the
        episode's wall time unless given (single-turn scoring times a whole batch)."""
        tokens = sum(len(t.prompt_ids) + len(t.completion_ids) for t in traj.turns)
        info = traj.info
        return cls(domain, info["task_id"], float(traj.reward), bool(info.get("passed", False)), tokens,
                   float(info.get("wall_s", 0.0) if sandbox_s is None else sandbox_s), info.get("ended") == "infra_error",
                   bool(info.get("guided", False)))


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


class TaskScheduler:
    def __init__(self, domains: list[Domain], cfg: SchedulingConfig = SchedulingConfig(), seed: int = 0, group_size: int = 1):
        if not domains:
            raise LonghaulError("a task scheduler needs at least one domain")
        if len({d.name for d in domains}) != len(domains):
            raise LonghaulError("domain names repeat; give each domain a distinct name")
        for d in domains:
            if d.budget_episodes is not None and d.budget_episodes < group_size:
                raise LonghaulError(f"domain {d.name!r} has budget_episodes {d.budget_episodes}, below one group of "
                                    f"{group_size} episodes; raise the budget or lower rollout.group_size")
        self.cfg, self.seed, self.group_size = cfg, seed, group_size
        self.domains = list(domains)
        self.queues = [DomainQueue(d, cfg, group_size) for d in domains]
        self.index = {d.name: i for i, d in enumerate(domains)}
        self.share = FairShare([d.weight for d in domains], [d.priority for d in domains], cfg.mixing)
        self.rng = random.Random(seed)
        self.counters = [DomainMetrics(d.name) for d in domains]
        self.step_draws = 0

    @classmethod
    def from_config(cls, domains: list[DomainConfig], cfg: SchedulingConfig = SchedulingConfig(), seed: int = 0,
                    group_size: int = 1, manifest: Path | None = None) -> "TaskScheduler":
        """Resolve the domains (envcheck gate, version pins, pools) and build the scheduler."""
        return cls(build_domains(domains, manifest), cfg, seed, group_size)

    def domain(self, name: str) -> Domain:
        return self.domains[self._queue_index(name)]

    def _queue_index(self, name: str) -> int:
        if name not in self.index:
            raise LonghaulError(f"unknown domain {name!r}; the run's domains are {', '.join(self.index)}")
        return self.index[name]

    @property
    def exhausted(self) -> bool:
        """No domain can ever be drawn again."""
        return all(q.exhausted() for q in self.queues)

    def next_tasks(self, n: int) -> list[Draw]:
        """Up to `n` draws for the next rollout batch (see the module docstring for the rules)."""
        out: list[Draw] = []
        while len(out) < n:
            cands = [i for i, q in enumerate(self.queues) if q.drawable()]
            if not cands:
                break
            i = self.share.pick(cands, self.rng)
            out.append(Draw(self.domains[i].name, self.queues[i].draw(self.rng)))
            self.counters[i].drawn()
            self.step_draws += 1
        return out

    def record(self, outcomes: Iterable[Outcome]) -> None:
        """Feed finished episodes back: curriculum stats, budgets, metrics."""
        for o in outcomes:
            i = self._queue_index(o.domain)
            q = self.queues[i]
            if o.task_id not in q.index:
                raise LonghaulError(f"task {o.task_id!r} is not in domain {o.domain!r}'s pool; record outcomes of drawn tasks only")
            if o.guided:
                q.settle(o.task_id, None, 0)
                continue
            passed = None if o.infra_error else bool(o.passed)
            q.settle(o.task_id, passed, int(o.tokens))
            self.counters[i].add(float(o.reward), passed, int(o.tokens), float(o.sandbox_s))

    def cancel(self, draws: Iterable[Draw]) -> None:
        """Draws that will not run (pre-empted, or a worker died before starting them)."""
        for d in draws:
            self.queues[self._queue_index(d.domain)].cancel(d.task.task_id)

    def preemptible(self, pending: Iterable[Draw]) -> list[Draw]:
        """Of the draws handed out but not started, those a drawable domain of strictly higher
        priority pre-empts: an asynchronous runtime `cancel`s them and asks `next_tasks` again."""
        live = [self.domains[i].priority for i, q in enumerate(self.queues) if q.drawable()]
        if not live:
            return []
        top = max(live)
        return [d for d in pending if preempts(top, self.domain(d.domain).priority)]

    def metrics(self) -> dict:
        """Flat per-domain metrics since the previous call (a training step), plus totals."""
        out: dict = {}
        for d, q, c in zip(self.domains, self.queues, self.counters):
            m = f"domain/{d.name}/"
            out.update(c.flat(self.step_draws))
            out[f"{m}tasks_retired"] = q.retired()
            out[f"{m}tasks_learnable"] = sum(in_band(s, self.cfg) for s in q.stats)
            out[f"{m}exhausted"] = int(q.exhausted())
            c.flush()
        out["scheduling/domains_exhausted"] = sum(q.exhausted() for q in self.queues)
        self.step_draws = 0
        return out

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue the same draws (JSON-able)."""
        return {"seed": self.seed, "rng": _rng_state(self.rng), "credit": {d.name: c for d, c in zip(self.domains, self.share.credit)}, "step_draws": self.step_draws,
                "queues": {d.name: q.state_dict() for d, q in zip(self.domains, self.queues)},
                "metrics": {d.name: c.state_dict() for d, c in zip(self.domains, self.counters)}}

    def load_state_dict(self, state: dict) -> None:
        if sorted(state["queues"]) != sorted(self.index):
            raise LonghaulError(f"the checkpoint's domains ({', '.join(sorted(state['queues']))}) differ from the config's "
                                f"({', '.join(sorted(self.index))}); resume with the same domains")
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.share.credit = [float(state["credit"][d.name]) for d in self.domains]
        self.step_draws = state["step_draws"]
        for d, q, c in zip(self.domains, self.queues, self.counters):
            q.load_state_dict(state["queues"][d.name])
            c.load_state_dict(state["metrics"][d.name])
