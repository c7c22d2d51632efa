"""Datasets built from a single-turn task family, in the formats the offline trainers read.

- `sft`: `{"prompt": [user message], "completion": reference reply}`: a cold start on
  references that the family's verifier passes.
- `prefs`: `{"prompt", "chosen", "rejected"}`: chosen is the reference reply; rejected is the
  same code with one small mutation (`longhaul.envs.mutate`) that the verifier *fails*, so the
  pair differs by a real bug, not by style. Tasks with no failing mutant are skipped.
Every reply is scored by the family's own verifier in the sandbox; nothing unchecked is written.
Does not cover multi-turn (workspace) families: their references are action scripts, not replies.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from longhaul.envs.mutate import enumerate_mutants
from longhaul.errors import LonghaulError

_FENCE = re.compile(r"```python\n(.*?)```", re.S)


def _messages(task) -> list[dict]:
    return [{"role": "user", "content": task.prompt}]


def _failing_mutant(family, task, reply: str, timeout_s: float, workers: int, limit: int = 6) -> str | None:
    """A reply whose code differs from `reply` by one mutation and fails the verifier."""
    m = _FENCE.search(reply)
    if not m:
        return None
    code = m.group(1)
    try:
        mutants = enumerate_mutants("reply.py", code)
    except SyntaxError:
        return None
    candidates = []
    for mutant in mutants[:limit]:
        try:
            candidates.append(reply.replace(code, mutant.apply(code), 1))
        except ValueError:
            continue
    if not candidates:
        return None
    scores = family.score_many([task] * len(candidates), candidates, timeout_s=timeout_s, workers=workers)
    return next((c for c, s in zip(candidates, scores) if not s.passed and s.status != "timeout"), None)


def build_rows(family, kind: str, split: str, n: int, difficulty: int = 1, timeout_s: float = 5.0, workers: int = 2,
               on_task=None) -> list[dict]:
    if family.kind != "answer" or family.reference_reply is None:
        raise LonghaulError(f"family {family.name!r} has no single-turn reference replies; build datasets from funcgen-like families")
    tasks = family.make_split(split, n, difficulty, None)
    replies = [family.reference_reply(t) for t in tasks]
    ok = family.score_many(tasks, replies, timeout_s=timeout_s, workers=workers)
    rows = []
    for task, reply, score in zip(tasks, replies, ok):
        if on_task:
            on_task()
        if not score.passed:
            continue  # a reference its own verifier fails is not training data
        if kind == "sft":
            rows.append({"prompt": _messages(task), "completion": reply, "task_id": task.task_id})
        else:
            bad = _failing_mutant(family, task, reply, timeout_s, workers)
            if bad is not None:
                rows.append({"prompt": _messages(task), "chosen": reply, "rejected": bad, "task_id": task.task_id})
    return rows


def write_jsonl(rows: list[dict], out: str | Path) -> Path:
    """Write atomically: a temp file renamed into place."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, out)
    return out
