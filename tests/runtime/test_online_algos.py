"""The on-policy algorithms other than GRPO through the same run: PPO (actor + critic) and
on-policy distillation train on examples/tiny_grpo.yaml and resume 2+2 steps bit for bit."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longhaul.config import load_config
from longhaul.runtime import train

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_grpo.yaml"
EXTRA = {"ppo": ["algo.name=ppo", "algo.ppo_epochs=2", "algo.mini_batches=2", "algo.kl_penalty=reward", "algo.critic_lr=1e-3"],
         "onpolicy_distill": ["algo.name=onpolicy_distill", "algo.teacher=tiny-llama-large", "algo.kl_coef=0"]}


def _cfg(out, algo, *more):
    return load_config(EXAMPLE, [f"output_dir={out}", "log.progress=false", "log.tensorboard=false", "eval.before_after=false",
                                 *EXTRA[algo], *more])


@pytest.mark.parametrize("algo", list(EXTRA))
def test_online_algorithm_trains_and_resumes_two_plus_two_bit_for_bit(tmp_path, algo):
    train(_cfg(tmp_path / "a", algo))
    train(_cfg(tmp_path / "b", algo, "train.steps=2"))
    train(_cfg(tmp_path / "b", algo), resume=True)
    ra, rb = tmp_path / "a" / "tiny_grpo", tmp_path / "b" / "tiny_grpo"
    wa, wb = (load_file(r / "checkpoints" / "step_4" / "model.safetensors") for r in (ra, rb))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = (torch.load(r / "checkpoints" / "step_4" / "trainer_state.pt", weights_only=False) for r in (ra, rb))
    if algo == "ppo":
        ca, cb = sa["critic"], sb["critic"]
        assert ca.keys() == cb.keys() and all(torch.equal(ca[k], cb[k]) for k in ca)
    strip = lambda r: [{k: v for k, v in json.loads(x).items() if not k.startswith("timing") and k not in ("step_time", "tokens_per_s")}
                       for x in (r / "metrics.jsonl").read_text().splitlines()]
    rows = strip(ra)
    assert rows == strip(rb) and len(rows) == 4
    assert any(r["grad_norm"] > 0 for r in rows)
    if algo == "ppo":
        assert "critic/value_loss" in rows[0] and "critic/explained_variance" in rows[0]
