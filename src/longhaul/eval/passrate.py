"""Greedy pass-rate evaluation of a policy on a fixed list of tasks, and paired comparison."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from longhaul.agent.rollout import rollout_groups
from longhaul.eval.agent_metrics import agent_metrics
from longhaul.eval.stats import bootstrap_mean, mcnemar_exact, paired_bootstrap, pass_at_k, wilson
from longhaul.inference import RolloutParams


LIMIT_STATUSES = ("timeout", "limit", "truncated")  # ran out of time, memory, turns or context


@dataclass
class EvalResult:
    label: str
    task_ids: list[str]
    passed: list[bool]  # the first sample of each task (the greedy answer when samples == 1)
    statuses: list[str]  # of every sample, task-major
    counts: list[int] | None = None  # correct samples per task, when samples > 1
    samples: int = 1
    agent: dict | None = None  # agent_metrics of the first sample of each task (multi-turn families)
    rewards: list[float] | None = None  # the first sample's reward of each task: partial credit where the family gives it

    @property
    def rate(self) -> float:
        return sum(self.passed) / max(1, len(self.passed))

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(sum(self.passed), len(self.passed))

    def summary(self, ks: tuple[int, ...] = (1, 5, 10)) -> dict:
        ks = tuple(sorted({*ks, self.samples}))
        lo, hi = self.interval
        st = Counter(self.statuses)
        out = {"label": self.label, "n": len(self.passed), "passed": sum(self.passed), "pass_rate": self.rate,
               "ci95": [lo, hi], "statuses": dict(st), "no_compile_rate": st.get("syntax", 0) / max(1, len(self.statuses)),
               "limit_rate": sum(st.get(k, 0) for k in LIMIT_STATUSES) / max(1, len(self.statuses)), "samples": self.samples}
        if self.agent:
            out["agent"] = self.agent
        if self.rewards:
            out["mean_reward"] = sum(self.rewards) / len(self.rewards)
            out["mean_reward_ci95"] = list(bootstrap_mean(self.rewards))
        groups: dict[str, list[int]] = {}
        for tid, ok in zip(self.task_ids, self.passed):
            g = groups.setdefault(_group(tid), [0, 0])
            g[0], g[1] = g[0] + 1, g[1] + bool(ok)
        out["by_subfamily"] = {k: {"n": n, "passed": p} for k, (n, p) in sorted(groups.items())}
        counts = self.counts if self.counts is not None else [int(p) for p in self.passed]
        if counts:
            for k in ks:
                if k <= self.samples:
                    per_task = [pass_at_k(self.samples, c, k) for c in counts]
                    out[f"pass@{k}"] = sum(per_task) / len(per_task)
                    # one sample a task: pass@1 is a proportion, and Wilson's interval is the right one
                    out[f"pass@{k}_ci95"] = [lo, hi] if self.samples == 1 else list(bootstrap_mean(per_task))
        return out

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(self), "summary": self.summary()}))
        os.replace(tmp, path)

    @classmethod
    def concat(cls, results: list["EvalResult"]) -> "EvalResult":
        """One result over several task sets (a joint run's domains), same label and samples."""
        counts = None if any(r.counts is None for r in results) else [c for r in results for c in r.counts]
        rewards = None if any(r.rewards is None for r in results) else [x for r in results for x in r.rewards]
        return cls(results[0].label, [t for r in results for t in r.task_ids], [p for r in results for p in r.passed],
                   [s for r in results for s in r.statuses], counts, results[0].samples, _merge_agent(results), rewards)

    @classmethod
    def load(cls, path: Path) -> "EvalResult":
        d = json.loads(path.read_text())
        return cls(d["label"], d["task_ids"], d["passed"], d["statuses"], d.get("counts"), d.get("samples", 1), d.get("agent"),
                   d.get("rewards"))


def _merge_agent(results: list[EvalResult]) -> dict | None:
    """The parts' agent metrics over all their episodes: each mean weighted by what it is a mean over."""
    parts = [r.agent for r in results if r.agent]
    if not parts:
        return None

    def weight(p: dict, key: str) -> float:
        if key == "turns_to_submit":
            return p["episodes"] * p["submit_rate"]
        return p["episodes_with_failures"] if key == "repair_rate" else p["episodes"]

    out = {k: sum(p[k] for p in parts) for k in ("episodes", "episodes_with_failures")}
    for key in parts[0]:
        if key not in out:
            pairs = [(p[key], weight(p, key)) for p in parts if p.get(key) is not None]
            total = sum(w for _, w in pairs)
            out[key] = sum(v * w for v, w in pairs) / total if total else None
    return out


def evaluate(model, tok, family, tasks, label: str, max_new_tokens: int, batch_size: int = 32,
             exec_timeout_s: float = 5.0, exec_workers: int = 2, on_batch: Callable[[int], None] | None = None,
             samples: int = 1, temperature: float = 0.8, seed: int = 0, max_turns: int = 10, agent: dict | None = None,
             on_episodes: Callable[[list], None] | None = None, max_tokens: int | None = None) -> EvalResult:
    """Greedy (samples == 1) or `samples` draws at `temperature` per task, for pass@k. `agent`:
    further AgentConfig fields of multi-turn episodes; `on_episodes` sees each batch's trajectories;
    `max_tokens`: the context an episode may fill (default the sampler's)."""
    temp = 0.0 if samples == 1 else temperature
    params = RolloutParams(max_new_tokens=max_new_tokens, temperature=temp, stop=family.stop, batch_size=max(batch_size, samples))
    per_call = max(1, batch_size // samples)
    passed, statuses, counts, firsts, rewards = [], [], [], [], []
    for start in range(0, len(tasks), per_call):
        chunk = tasks[start:start + per_call]
        groups, _ = rollout_groups(model, tok, family, chunk, samples, params, seed + start, max_turns=max_turns, max_tokens=max_tokens,
                                   exec_timeout_s=exec_timeout_s, exec_workers=exec_workers, agent=agent)
        if on_episodes:
            on_episodes([t for g in groups for t in g])
        for t in (t for g in groups for t in g):
            if t.info["ended"] == "truncated" and not t.info["passed"]:
                t.info["status"] = "truncated"  # ran out of turns or context: a limit, not a wrong answer
        passed += [g[0].info["passed"] for g in groups]
        firsts += [g[0] for g in groups]
        rewards += [float(g[0].reward) for g in groups]
        statuses += [t.info["status"] for g in groups for t in g]
        counts += [sum(t.info["passed"] for t in g) for g in groups]
        if on_batch:
            on_batch(len(chunk))
    return EvalResult(label, [t.task_id for t in tasks], passed, statuses, counts if samples > 1 else None, samples,
                      agent_metrics(firsts) or None, rewards)


def compare(base: EvalResult, trained: EvalResult) -> dict:
    if base.task_ids != trained.task_ids:
        raise ValueError("before/after evaluations must use the same tasks in the same order")
    test = mcnemar_exact(base.passed, trained.passed)
    lo, hi = paired_bootstrap(base.passed, trained.passed)
    groups: dict[str, list[int]] = {}
    for tid, b, t in zip(base.task_ids, base.passed, trained.passed):
        g = groups.setdefault(_group(tid), [0, 0, 0])
        g[0], g[1], g[2] = g[0] + 1, g[1] + b, g[2] + t
    by_group = {k: {"n": n, "base": b, "trained": t} for k, (n, b, t) in sorted(groups.items())}
    return {"base": base.summary(), "trained": trained.summary(), "difference": trained.rate - base.rate,
            "difference_ci95": [lo, hi], "mcnemar": test, "significant": test["p_value"] < 0.05 and trained.rate > base.rate,
            "by_group": by_group}


def _group(task_id: str) -> str:
    """The sub-family of a task id `family/vN/sub/...` (or the family when it has none)."""
    parts = task_id.split("/")
    return parts[2] if len(parts) > 3 and not re.fullmatch(r"d\d+", parts[2]) else parts[0]
