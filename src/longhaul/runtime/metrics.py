"""Metric sinks for a run: `metrics.jsonl` (one line a step) and TensorBoard when installed."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print("note: tensorboard is not installed; metrics go to metrics.jsonl only (pip install tensorboard)")
            else:
                self.tb = SummaryWriter(str(run_dir / "tensorboard"))

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
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


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
