"""Trajectories for a batch of tasks, whatever the family's kind: the one rollout call that
training and evaluation share.

Answer families sample one reply per trajectory (`single_turn.run_groups`); workspace families
run one agent episode per trajectory through the loop and the sandbox (`loop.run_episodes`).
"""

from __future__ import annotations

import threading
import time

from longhaul.agent.demos import scripts_for
from longhaul.agent.loop import AgentConfig, ModelPolicy, ScriptedPolicy, run_episodes
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
                   exec_workers: int = 2, make_env=None, agent: dict | None = None,
                   guidance: str = "off") -> tuple[list[list[Trajectory]], dict]:
    """`group_size` trajectories per task, grouped by task, and timings (`timing/gen`,
    `timing/score`, `gen_tokens`). `params` sets the per-reply budget and sampling; `make_env`
    (task -> Env) replaces the family's env for workspace families (e.g. other sandbox limits);
    `agent` sets further AgentConfig fields of multi-turn episodes (context policy, keep_messages);
    `guidance` (a demonstration variant, or "off") puts an oracle episode into every multi-turn
    group that no sample passed (`guide`)."""
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
    groups = [trajs[i * group_size:(i + 1) * group_size] for i in range(len(tasks))]
    if guidance != "off":
        guide(groups, tasks, tok, make_env or family.make_env or (lambda t: WorkspaceEnv()), agent, guidance, version,
              family.demo_scripts)
    total = time.perf_counter() - t0
    return groups, {"timing/gen": policy.seconds, "timing/score": total - policy.seconds,
                    "gen_tokens": sum(t.completion_len for t in trajs)}


def guide(groups: list[list[Trajectory]], tasks: list, tok, make_env, agent: AgentConfig, variant: str, version: int = 0,
          custom=None) -> int:
    """Off-policy guidance (after LUFFY, Yan et al. 2025): in each group where no sampled episode
    passed, the last sample is replaced by the task's oracle demonstration (`agent.demos`, the
    given variant), replayed through the same loop, sandbox, tokenizer and budgets as the samples,
    and kept only if its hidden checks pass. The group then has one success to be measured
    against, so a kind of task the policy cannot yet solve still yields a gradient.

    The demonstration's tokens were written by no sampler: their behaviour log-probs are NaN,
    which trainers read as on-policy (no importance correction); `info["guided"]` marks it, and
    metrics and curricula count sampled episodes only. `custom` is the family's `demo_scripts`, if
    it writes its own. Returns the number of groups guided."""
    need = [i for i, g in enumerate(groups)
            if g and not any(t.info.get("passed") for t in g) and not all(t.info.get("ended") == "infra_error" for t in g)
            and getattr(tasks[i], "reference", None)]
    scripts, chosen = {}, []
    for i in need:
        got = scripts_for(tasks[i], variant, custom=custom)
        if got is not None and len(got[0]) <= agent.max_turns:
            key = f"guide:{i}:{tasks[i].task_id}"
            scripts[key] = got[0]
            chosen.append((i, key))
    if not chosen:
        return 0
    demos = run_episodes(ScriptedPolicy(tok, scripts), tok, make_env, [tasks[i] for i, _ in chosen], agent,
                         keys=[k for _, k in chosen])
    n = 0
    for (i, key), demo in zip(chosen, demos):
        if not demo.info.get("passed") or demo.info.get("turns") != len(scripts[key]) \
                or any(len(t.completion_ids) > agent.max_new_tokens for t in demo.turns):
            continue  # the oracle did not pass here, or wrote a reply the policy could not: the group stays as sampled
        for turn in demo.turns:
            turn.logprobs = [float("nan")] * len(turn.completion_ids)
            turn.versions = [version] * len(turn.completion_ids)
        demo.group = groups[i][-1].group
        demo.info["guided"] = True
        groups[i][-1] = demo
        n += 1
    return n
