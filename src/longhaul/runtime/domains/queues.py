"""Task-level queues: one queue per domain, and the weighted fair sharing between them.

`DomainQueue` holds one domain's training pool with each task's recent outcomes, the episodes
still in flight per task, and the budget spent; it draws its next task by the curriculum's
weights, never a task already in flight. `FairShare` decides which domain fills the next
slot. The rules, which `TaskScheduler` and the cluster `Placer` (`longhaul.placement`) share:

- Priorities are strict classes: among the domains that can be drawn now, only those of the
  highest priority are considered (`preempts`: a higher priority pre-empts a lower one, equal
  priorities never pre-empt each other).
- Within a class, slots follow the weights: `stride` is smooth weighted round robin (after N
  slots each domain's count is within a slot or two of N * w / sum(w), deterministic); `sample`
  draws i.i.d. with probability w / sum(w) from the scheduler's seeded generator.
- A domain that cannot be drawn (budget spent, every task retired or in flight) is skipped and
  its share goes to the others of its class in proportion to their weights; its round-robin
  credit is frozen, not accumulated, so it does not burst when it returns.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from itertools import accumulate

from longhaul.errors import LonghaulError
from longhaul.runtime.domains.curriculum import CURRICULA, TaskStats
from longhaul.runtime.domains.domains import Domain, SchedulingConfig


def preempts(new_priority: int, old_priority: int) -> bool:
    """The one pre-emption rule: strictly higher priority wins; ties never pre-empt."""
    return new_priority > old_priority


class DomainQueue:
    """One domain's pool: curriculum weights over the tasks not in flight, and its budget.
    Outcomes are kept per task, or pooled per sub-family (`curriculum_unit`)."""

    def __init__(self, domain: Domain, cfg: SchedulingConfig, group_size: int = 1):
        self.domain, self.cfg, self.group_size = domain, cfg, group_size
        self.policy = CURRICULA.get_fn(domain.curriculum or cfg.curriculum)
        self.index = {t.task_id: i for i, t in enumerate(domain.tasks)}
        # the unit whose outcomes weigh a task: the task itself, or its sub-family (pooled outcomes,
        # so a sub-family found unlearnable is weighed down before each of its tasks is drawn)
        self.unit = [self._unit_of(t) for t in domain.tasks]
        self.members: dict[str, list[int]] = {}
        for i, key in enumerate(self.unit):
            self.members.setdefault(key, []).append(i)
        self._fresh_stats()
        self.in_flight: dict[int, int] = {}  # task index -> episodes still expected back
        self.episodes = 0  # recorded episodes (infra errors excluded): the episode budget
        self.tokens = 0  # recorded tokens: the token budget

    def _unit_of(self, task) -> str:
        if self.cfg.curriculum_unit == "subfamily":
            return f"subfamily:{getattr(task, 'subfamily', None) or task.task_id}"
        return task.task_id

    def _fresh_stats(self) -> None:
        self.by_unit = {key: TaskStats() for key in self.members}
        self.stats = [self.by_unit[key] for key in self.unit]  # a task's view: shared by the tasks of one unit
        self.weights = [self.policy(s, self.cfg, self.group_size) for s in self.stats]

    # budget and availability
    def reserved(self) -> int:
        return sum(self.in_flight.values())

    def budget_spent(self) -> bool:
        d = self.domain
        if d.budget_episodes is not None and self.episodes + self.reserved() + self.group_size > d.budget_episodes:
            return True
        return d.budget_tokens is not None and self.tokens >= d.budget_tokens

    def retired(self) -> int:
        return sum(1 for w in self.weights if w <= 0)

    def exhausted(self) -> bool:
        """Never drawable again: budget spent with nothing in flight, or every task retired."""
        return (self.budget_spent() and not self.in_flight) or self.retired() == len(self.weights)

    def drawable(self) -> bool:
        return not self.budget_spent() and any(w > 0 and i not in self.in_flight for i, w in enumerate(self.weights))

    # draw and settle
    def draw(self, rng: random.Random):
        """The next task, with probability proportional to its curriculum weight (one rng call)."""
        eff = [0.0 if i in self.in_flight else w for i, w in enumerate(self.weights)]
        cum = list(accumulate(eff))
        i = min(bisect_right(cum, rng.random() * cum[-1]), len(cum) - 1)
        while eff[i] <= 0:  # only when rng.random() * total lands exactly on a boundary
            i -= 1
        self.in_flight[i] = self.group_size
        self.stats[i].draws += 1
        return self.domain.tasks[i]

    def settle(self, task_id: str, passed: bool | None, tokens: int) -> None:
        """One episode of `task_id` came back; `passed` None marks an infra error (no outcome)."""
        i = self.index[task_id]
        self.tokens += tokens
        if passed is not None:
            self.episodes += 1
            stats = self.stats[i]
            stats.add(passed, self.cfg.window)
            for j in self.members[self.unit[i]]:
                self.weights[j] = self.policy(stats, self.cfg, self.group_size)
        left = self.in_flight.get(i, 0) - 1
        if left > 0:
            self.in_flight[i] = left
        else:
            self.in_flight.pop(i, None)

    def cancel(self, task_id: str) -> None:
        """A drawn task that will not run: its reservation is returned, nothing is recorded."""
        self.in_flight.pop(self.index[task_id], None)

    # persistence: only tasks that were ever drawn carry state
    def state_dict(self) -> dict:
        return {"fingerprint": self.domain.fingerprint(), "episodes": self.episodes, "tokens": self.tokens,
                "in_flight": {self.domain.tasks[i].task_id: n for i, n in self.in_flight.items()},
                "stats": {key: [list(s.recent), s.draws] for key, s in self.by_unit.items() if s.draws or s.recent}}

    def load_state_dict(self, state: dict) -> None:

        if state["fingerprint"] != self.domain.fingerprint():
            raise LonghaulError(f"domain {self.domain.name!r} draws from another task pool than the checkpoint did (its config or "
                                "family changed); resume with the same domains, or start a new run")
        unknown = sorted(set(state["stats"]) - set(self.by_unit))
        if unknown:
            raise LonghaulError(f"domain {self.domain.name!r}: the checkpoint's curriculum kept outcomes per {unknown[0]!r}, "
                                f"this run per {self.cfg.curriculum_unit}; resume with the same scheduling.curriculum_unit")
        self.episodes, self.tokens = state["episodes"], state["tokens"]
        self._fresh_stats()
        for key, (recent, draws) in state["stats"].items():
            s = self.by_unit[key]
            s.recent.extend(bool(x) for x in recent)
            s.draws = draws
        self.weights = [self.policy(s, self.cfg, self.group_size) for s in self.stats]
        self.in_flight = {}  # episodes in flight at the checkpoint never came back: their reservations are returned


class FairShare:
    """Which domain fills the next slot: strict priority classes, weights within a class."""

    def __init__(self, weights: list[float], priorities: list[int], mixing: str = "stride"):
        if mixing not in ("stride", "sample"):
            raise ValueError(f"mixing must be 'stride' or 'sample', got {mixing!r}")
        self.weights, self.priorities, self.mixing = weights, priorities, mixing
        self.credit = [0.0] * len(weights)  # smooth weighted round robin state

    def pick(self, candidates: list[int], rng: random.Random) -> int:
        top = max(self.priorities[c] for c in candidates)
        cls = [c for c in candidates if self.priorities[c] == top]
        if len(cls) == 1:
            return cls[0]
        if self.mixing == "sample":
            cum = list(accumulate(self.weights[c] for c in cls))
            return cls[min(bisect_right(cum, rng.random() * cum[-1]), len(cls) - 1)]
        total = 0.0
        for c in cls:
            self.credit[c] += self.weights[c]
            total += self.weights[c]
        best = max(cls, key=lambda c: (self.credit[c], -c))  # ties: the earlier domain in the config
        self.credit[best] -= total
        return best
