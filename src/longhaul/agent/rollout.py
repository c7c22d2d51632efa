"""Trajectories for a batch of tasks, whatever the family's kind: the one rollout call that
training and evaluation share.

Answer families sample one reply per trajectory (`single_turn.run_groups`); workspace families
run one agent episode per trajectory through the loop and the sandbox (`loop.run_episodes`).
"""

from __future__ import annotations

import threading
import time

from longhaul.agent.loop import AgentConfig, ModelPolicy, run_episodes
from longhaul.agent.single_turn import run_groups
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.inference import RolloutParams, context_length
from longhaul.types import Trajectory


class TimedPolicy:
    """A policy that counts the seconds during which a generation is in flight (the rest of a
    rollout is env work alone). Concurrent calls overlap: their union is counted, not their sum."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0
        self._lock, self._busy, self._since = threading.Lock(), 0, 0.0

    @property
    def concurrent(self) -> bool:
        return getattr(self.inner, "concurrent", False)

    def generate(self, prompts, sampling, keys=None):
        with self._lock:
            if self._busy == 0:
                self._since = time.perf_counter()
            self._busy += 1
        try:
            return self.inner.generate(prompts, sampling, keys)
        finally:
            with self._lock:
                self._busy -= 1
                if self._busy == 0:
                    self.seconds += time.perf_counter() - self._since


def rollout_groups(model, tok, family, tasks, group_size: int, params: RolloutParams, seed: int, version: int = 0,
                   max_turns: int = 8, max_tokens: int | None = None, exec_timeout_s: float = 5.0,
                   exec_workers: int = 2, make_env=None, agent: dict | None = None) -> tuple[list[list[Trajectory]], dict]:
    """`group_size` trajectories per task, grouped by task, and timings (`timing/gen`,
    `timing/score`, `gen_tokens`). `params` sets the per-reply budget and sampling; `make_env`
    (task -> Env) replaces the family's env for workspace families (e.g. other sandbox limits);
    `agent` sets further AgentConfig fields of multi-turn episodes (context policy, keep_messages)."""
    if family.kind == "answer":
        return run_groups(model, tok, family, tasks, params, group_size, seed=seed, version=version,
                          exec_timeout_s=exec_timeout_s, exec_workers=exec_workers)

    policy = TimedPolicy(ModelPolicy(model, tok, version=version, seed=seed))
    agent = AgentConfig(max_turns=max_turns, max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                        top_p=params.top_p, max_tokens=max_tokens or context_length(model),
                        workers=2 * exec_workers, **(agent or {}))
    flat = [t for t in tasks for _ in range(group_size)]
    t0 = time.perf_counter()
    trajs = run_episodes(policy, tok, make_env or family.make_env or (lambda t: WorkspaceEnv()), flat, agent,
                         groups=[i // group_size for i in range(len(flat))])
    total = time.perf_counter() - t0
    groups = [trajs[i * group_size:(i + 1) * group_size] for i in range(len(tasks))]
    return groups, {"timing/gen": policy.seconds, "timing/score": total - policy.seconds,
                    "gen_tokens": sum(t.completion_len for t in trajs)}
