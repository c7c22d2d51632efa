"""Curriculum policies: which of a domain's tasks to draw next, from each task's recent outcomes.

A policy is a pure function `(stats: TaskStats, cfg: SchedulingConfig, group_size) -> weight >= 0`,
registered by name; a domain draws its next task with probability proportional to the weights
of its tasks that are not already in flight. Weight 0 retires a task: it is never drawn again
unless its stats change (they cannot, since it is not drawn), so retirement is permanent
without extra state. Policies:

- `uniform`: every task 1.
- `learnable_band`: tasks whose recent pass rate is strictly between 0 and 1 get `boost` (they
  carry a GRPO gradient); tasks stuck at 0 or 1 get `floor` (kept above 0 because the policy
  moves); tasks with fewer than `min_samples` outcomes get 1 (unexplored).
- `expected_signal`: the chance that a group of `group_size` episodes of the task has mixed
  outcomes (a GRPO gradient), 1 - p^G - (1 - p)^G at the posterior mean p of its pass rate under
  a uniform prior (a plug-in estimate), relative to the chance at p = 1/2 (so an unexplored task
  weighs 1). A task that failed one group of 4 still weighs 0.59, one that failed 16 episodes
  0.23: unlike the band's boost and floor (40x apart after a single group), a kind of task that
  few groups have tried keeps being drawn, and the draws follow the evidence as it accumulates.
  The lowest weight is set by `window` (p never leaves [1/(window+2), 1 - 1/(window+2)]).
- `retire_solved`: a task whose last `min_samples` outcomes all passed gets 0; others 1.
- `revisit_failures`: a task with a failure among its recent outcomes gets `boost`; others 1.

This module owns the policies and the per-task statistics; the draw itself is `queues`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from longhaul.rl.registry import Registry

CURRICULA = Registry("curriculum policy")


@dataclass
class TaskStats:
    """Recent outcomes of one task, or of one sub-family's tasks pooled (most recent last), at most `window` of them."""
    recent: deque = field(default_factory=deque)
    draws: int = 0  # times the task was handed out

    def add(self, passed: bool, window: int) -> None:
        self.recent.append(bool(passed))
        while len(self.recent) > window:
            self.recent.popleft()

    @property
    def n(self) -> int:
        return len(self.recent)

    @property
    def rate(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else float("nan")

    def last(self, k: int) -> list[bool]:
        return list(self.recent)[-k:]


@CURRICULA.register("uniform")
def uniform(stats: TaskStats, cfg, group_size: int = 1) -> float:
    return 1.0


@CURRICULA.register("learnable_band")
def learnable_band(stats: TaskStats, cfg, group_size: int = 1) -> float:
    if stats.n < cfg.min_samples:
        return 1.0
    return cfg.boost if 0.0 < stats.rate < 1.0 else cfg.floor


@CURRICULA.register("expected_signal")
def expected_signal(stats: TaskStats, cfg, group_size: int = 1) -> float:
    g = max(2, group_size)  # a single sample's signal is its variance, p (1 - p): the g = 2 case
    p = (sum(stats.recent) + 1) / (stats.n + 2)  # posterior mean under a uniform prior
    return (1.0 - p ** g - (1.0 - p) ** g) / (1.0 - 2.0 * 0.5 ** g)


@CURRICULA.register("retire_solved")
def retire_solved(stats: TaskStats, cfg, group_size: int = 1) -> float:
    return 0.0 if stats.n >= cfg.min_samples and all(stats.last(cfg.min_samples)) else 1.0


@CURRICULA.register("revisit_failures")
def revisit_failures(stats: TaskStats, cfg, group_size: int = 1) -> float:
    return cfg.boost if stats.n and not all(stats.recent) else 1.0


def in_band(stats: TaskStats, cfg) -> bool:
    """Whether a task is learnable now (a metric: how much of a domain still carries signal)."""
    return stats.n >= cfg.min_samples and 0.0 < stats.rate < 1.0
