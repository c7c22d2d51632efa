"""Greedy pass-rate evaluation of a policy on a fixed list of tasks, and paired comparison."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from longhaul.agent.single_turn import run_groups
from longhaul.eval.stats import mcnemar_exact, paired_bootstrap, wilson
from longhaul.inference import SamplingParams


@dataclass
class EvalResult:
    label: str
    task_ids: list[str]
    passed: list[bool]
    statuses: list[str]

    @property
    def rate(self) -> float:
        return sum(self.passed) / max(1, len(self.passed))

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(sum(self.passed), len(self.passed))

    def summary(self) -> dict:
        lo, hi = self.interval
        return {"label": self.label, "n": len(self.passed), "passed": sum(self.passed), "pass_rate": self.rate,
                "ci95": [lo, hi], "statuses": dict(Counter(self.statuses))}

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(self), "summary": self.summary()}))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "EvalResult":
        d = json.loads(path.read_text())
        return cls(d["label"], d["task_ids"], d["passed"], d["statuses"])


def evaluate(model, tok, family, tasks, label: str, max_new_tokens: int, batch_size: int = 32,
             exec_timeout_s: float = 5.0, exec_workers: int = 2, on_batch: Callable[[int], None] | None = None) -> EvalResult:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=getattr(family, "stop", ()), batch_size=batch_size)
    passed, statuses = [], []
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start:start + batch_size]
        groups, _ = run_groups(model, tok, family, chunk, params, 1, seed=0, version=0,
                               exec_timeout_s=exec_timeout_s, exec_workers=exec_workers)
        passed += [g[0].info["passed"] for g in groups]
        statuses += [g[0].info["status"] for g in groups]
        if on_batch:
            on_batch(len(chunk))
    return EvalResult(label, [t.task_id for t in tasks], passed, statuses)


def compare(base: EvalResult, trained: EvalResult) -> dict:
    if base.task_ids != trained.task_ids:
        raise ValueError("before/after evaluations must use the same tasks in the same order")
    test = mcnemar_exact(base.passed, trained.passed)
    lo, hi = paired_bootstrap(base.passed, trained.passed)
    return {"base": base.summary(), "trained": trained.summary(), "difference": trained.rate - base.rate,
            "difference_ci95": [lo, hi], "mcnemar": test, "significant": test["p_value"] < 0.05 and trained.rate > base.rate}
