"""The on-policy algorithms other than GRPO through the same run: PPO (actor + critic) and
on-policy distillation train on examples/tiny_grpo.yaml and resume 2+2 steps bit for bit."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longhaul.runtime.metrics import without_clock
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
    strip = lambda r: [without_clock(json.loads(x)) for x in (r / "metrics.jsonl").read_text().splitlines()]
    rows = strip(ra)
    assert rows == strip(rb) and len(rows) == 4
    assert any(r["grad_norm"] > 0 for r in rows)
    if algo == "ppo":
        assert "critic/value_loss" in rows[0] and "critic/explained_variance" in rows[0]


def parity_reward(completions, tasks):
    """Half the tasks (odd numbers) always score 0, so their groups carry no gradient; the others
    score the parity of the reply's length, which varies within a group."""
    return [0.0 if int(t.task_id.rsplit("/", 1)[-1]) % 2 else float(len(c) % 2) for c, t in zip(completions, tasks)]


def test_dapo_dynamic_sampling_refills_equal_reward_groups_and_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    common = ["algo.dynamic_sampling=true", "algo.drop_zero_std_groups=true", "task.reward=test_online_algos:parity_reward",
              "rollout.group_size=4"]
    load = lambda out, *more: load_config(EXAMPLE, [f"output_dir={out}", "log.progress=false", "log.tensorboard=false",
                                                    "eval.before_after=false", *common, *more])
    train(load(tmp_path / "a"))
    rows = [json.loads(x) for x in (tmp_path / "a" / "tiny_grpo" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["frac_reward_zero_std"] == 0 for r in rows)  # every trained group varies
    assert sum(r["dynamic_sampling/groups_sampled"] for r in rows) > 2 * len(rows)  # refills happened
    state = torch.load(tmp_path / "a" / "tiny_grpo" / "checkpoints" / "step_4" / "trainer_state.pt", weights_only=False)
    assert state["data_position"] == sum(r["dynamic_sampling/groups_sampled"] for r in rows)
    train(load(tmp_path / "b", "train.steps=2"))
    train(load(tmp_path / "b"), resume=True)
    wa, wb = (load_file(tmp_path / d / "tiny_grpo" / "checkpoints" / "step_4" / "model.safetensors") for d in ("a", "b"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_trained_reward_model_rewards_a_grpo_run(tmp_path):
    """The RLHF path: train a reward model on preference pairs, then GRPO with its scores as rewards."""
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"echo {w}"}], "chosen": w, "rejected": w[::-1]}) + "\n"
                             for w in ["kalo", "mira", "tune", "dove", "pine", "lake"]))
    train(load_config(None, [f"output_dir={tmp_path}", "name=rm", "model.name=tiny-llama", "algo.name=rm", f"data.path={prefs}",
                             "data.batch_size=4", "train.steps=2", "train.autocast=none", "log.progress=false",
                             "log.tensorboard=false"]))
    ckpt = tmp_path / "rm" / "checkpoints" / "step_2"
    res = train(load_config(EXAMPLE, [f"output_dir={tmp_path}", f"task.reward_model={ckpt}", "train.steps=2",
                                      "eval.before_after=false", "log.progress=false", "log.tensorboard=false"]))
    rows = [json.loads(x) for x in (Path(res["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["reward"] not in (0.0, 1.0) for r in rows)  # real-valued model scores, not pass/fail
