"""Shared runs for the runtime tests: examples/tiny_grpo.yaml's plain synchronous run, which
several tests compare against, trained once a session instead of once a test."""

from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_grpo.yaml"
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.before_after=false"]


@pytest.fixture(scope="session")
def tiny_grpo_run(tmp_path_factory) -> Path:
    """The run directory of examples/tiny_grpo.yaml (4 steps, checkpoints at 2 and 4) run with
    QUIET and nothing else; read it, never write under it. It trains on one torch thread, as the
    tests' own runs do (the per-test fixture that sets one thread is not active yet here)."""
    import torch

    from longhaul.config import load_config
    from longhaul.runtime.online import run_training

    out = tmp_path_factory.mktemp("tiny_grpo_sync")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_training(load_config(EXAMPLE, [f"output_dir={out}", *QUIET]))
    finally:
        torch.set_num_threads(before)
    return out / "tiny_grpo"


def report_charts(page: str) -> int:
    """The training curves of a `report.html`: uPlot charts where uPlot is vendored (`make
    console`), else the plain SVG fallback."""
    from longhaul.console.vendor import UPLOT

    return page.count("<div data-chart=") if UPLOT.is_file() else page.count("<svg")
