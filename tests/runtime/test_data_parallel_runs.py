"""A run with `runtime.data_parallel=fsdp2` over two gloo trainers: it trains like one trainer, and
its checkpoint (the optimizer state gathered from the shards) resumes it to the same weights."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longhaul.config import load_config
from longhaul.errors import LonghaulError
from longhaul.runtime.online import run_training

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_grpo.yaml"
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.before_after=false"]


def _rewards(run: Path) -> list[float]:
    return [json.loads(line)["reward"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # ~20 s; tests/rl/test_distributed.py checks fsdp2's update equality in the fast suite
def test_fsdp2_trainers_train_like_one_and_resume_from_their_checkpoint(tmp_path, tiny_grpo_run):
    two = [f"output_dir={tmp_path / 'two'}", *QUIET, "runtime.trainers=2", "runtime.data_parallel=fsdp2"]
    run_training(load_config(EXAMPLE, [*two, "train.steps=2"]))
    run_training(load_config(EXAMPLE, two), resume=True)
    a, b = (tiny_grpo_run, tmp_path / "two" / "tiny_grpo")
    wa, wb = (load_file(r / "checkpoints" / "step_4" / "model.safetensors") for r in (a, b))
    assert wa.keys() == wb.keys(), "checkpoints hold the plain model's weights"
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst < 1e-5, f"max parameter difference {worst:.3g}"
    assert _rewards(a) == pytest.approx(_rewards(b), abs=1e-6)
    state = torch.load(b / "checkpoints" / "step_2" / "trainer_state.pt", weights_only=False)
    moments = [v["exp_avg"] for v in state["optimizer"]["state"].values()]
    assert moments and all(not hasattr(m, "full_tensor") for m in moments), "the saved optimizer state is gathered, not sharded"


def test_an_unknown_data_parallel_strategy_is_refused_by_name():
    with pytest.raises(LonghaulError, match=r"runtime.data_parallel.*'ddp' or 'fsdp2'"):
        load_config(EXAMPLE, ["runtime.data_parallel=zero3"])
