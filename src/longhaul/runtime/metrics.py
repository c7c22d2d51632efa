"""Metric sinks for a run: `metrics.jsonl` (one line a step, the source of truth) and the
trackers of `log.report_to` (`runtime.trackers`: TensorBoard, MLflow, W&B, Trackio)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from longhaul.console.episodes import message_turns, token_turns
from longhaul.runtime.trackers import TABLE_COLUMNS, open_trackers, resolve, tracker_scalars

if TYPE_CHECKING:
    from longhaul.config import RunConfig


class MetricsLog:
    def __init__(self, run_dir: Path, cfg: RunConfig | None = None, resume_step: int | None = None):
        """`cfg` None: metrics.jsonl alone (no tracker)."""
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        self.tables_every = cfg.log.tables_every if cfg is not None else 0
        self.trackers = [] if cfg is None else open_trackers(resolve(cfg.log.report_to), run_dir, cfg.log.project, cfg.name,
                                                              cfg.model_dump(mode="json"), resume_step)

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines of steps the checkpoint does not contain (they will be redone)."""
        keep = [line for line in self.path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, self.path)

    def write(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.trackers:
            scalars = tracker_scalars(metrics)
            for t in self.trackers:
                t.log_scalars(step, scalars)

    def write_rollouts(self, step: int, groups, tok) -> None:
        """Every `log.tables_every` steps, the step's episodes as a table to each tracker."""
        if self.trackers and self.tables_every and step % self.tables_every == 0:
            rows = rollout_rows(step, groups, tok)
            for t in self.trackers:
                t.log_table(step, rows)

    def close(self) -> None:
        for t in self.trackers:
            t.close()
        self.trackers = []


def rollout_rows(step: int, groups, tok) -> list[dict]:
    """One table row per sampled episode of a step (demonstrations put in by guidance left out):
    the prompt, what followed it whole (a reply, or every turn of a multi-turn episode), reward, pass."""
    rows = []
    for traj in (t for g in groups for t in g if not t.info.get("guided")):
        msgs = traj.info.get("messages")
        turns = message_turns(msgs, [t.reward for t in traj.turns]) if msgs else token_turns(traj.to_dict()["turns"], tok)
        head = 0
        while head < len(turns) and turns[head]["role"] != "assistant":
            head += 1
        rest = turns[head:]
        completion = rest[0]["content"] if len(rest) == 1 else "\n\n".join(f"[{t['role']}]\n{t['content']}" for t in rest)
        rows.append(dict(zip(TABLE_COLUMNS, (step, str(traj.info.get("task_id", "")), "\n\n".join(t["content"] for t in turns[:head]),
                                             completion, float(traj.reward), bool(traj.info.get("passed", False))))))
    return rows


# metrics that measure the wall clock or the process's memory: they differ between two runs that
# compute the same thing
CLOCK_PREFIXES = ("timing", "throughput/", "weight_sync/seconds", "weight_sync/total_seconds", "trainer/idle", "rollout/idle",
                  "step_time", "tokens_per_s", "memory/")


def without_clock(row: dict) -> dict:
    """A metrics row without its wall-clock and memory figures (what reproducibility checks compare)."""
    return {k: v for k, v in row.items() if not k.startswith(CLOCK_PREFIXES)}


def read_metrics(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []
