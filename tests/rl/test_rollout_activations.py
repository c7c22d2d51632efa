"""The rollout's recorded forward as the training forward: same log-probs, entropy and gradients
as running the forward (fp32 rounding), found by content across prefix-cache hits and
preemption, and refused whenever it is not the policy's maths."""

import copy

import pytest
import torch

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.rl.grpo import GRPOTrainer


def _setup(share_prompt=True, **engine_kw):
    model, tok = load_policy("tiny-llama")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # livelier than the built-in init, so completions differ
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.04, drop_zero_std_groups=False),
                          TrainConfig(autocast="none", share_prompt=share_prompt, micro_batch=8), temperature=0.8)
    engine = LLMEngine(model, tokenizer=tok, **{"num_kv_blocks": 256, "block_size": 4, **engine_kw})
    assert trainer.reuse_rollout_forward(engine)
    prompt = tok("<|im_start|>user\nsay something long and varied<|im_end|>\n").input_ids
    params = [SamplingParams(max_tokens=12, temperature=0.8, seed=s) for s in range(6)]
    outs = engine.generate([prompt] * 6, params)
    pairs = [(prompt, list(o.token_ids)) for o in outs]
    return model, trainer, engine, pairs


def _logprobs_and_grads(trainer, pairs):
    trainer.policy.zero_grad()
    lp, mask, ent = trainer._logprobs(trainer.policy, pairs, list(range(len(pairs))), with_entropy=True)
    (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
    return lp.detach(), mask, ent, {n: p.grad.clone() for n, p in trainer.policy.named_parameters()}


def _assert_recorded_equals_forward(trainer, pairs):
    assert trainer._recorded(pairs, list(range(len(pairs)))) is not None
    got = _logprobs_and_grads(trainer, pairs)
    rollout, trainer.rollout = trainer.rollout, None  # the plain packed forward
    want = _logprobs_and_grads(trainer, pairs)
    trainer.rollout = rollout
    assert torch.equal(got[1], want[1])
    assert (got[0] - want[0]).abs().max() < 1e-5 and (got[2] - want[2]).abs().max() < 1e-5
    for n in want[3]:
        rel = ((got[3][n] - want[3][n]).abs().max() / want[3][n].abs().max().clamp(min=1e-12)).item()
        assert rel < 1e-4, f"{n}: relative grad diff {rel}"


@pytest.mark.parametrize("share_prompt", [True, False])
def test_recorded_forward_equals_the_forward(share_prompt):
    model, trainer, engine, pairs = _setup(share_prompt)
    assert engine.stats()["prefix_cache_hits"] > 0  # the group's prompt blocks were computed once
    _assert_recorded_equals_forward(trainer, pairs)


def test_preempted_requests_are_found_and_unknown_sequences_are_not():
    model, trainer, engine, pairs = _setup(num_kv_blocks=20)  # too few blocks for 6 at once: preemption by recompute
    assert engine.stats()["num_preemptions_total"] > 0
    _assert_recorded_equals_forward(trainer, pairs)
    c = pairs[0][1]
    last_changed = [(pairs[0][0], c[:-1] + [(c[-1] + 1) % 200])]  # the last token is a target only: its rows exist
    mid_changed = [(pairs[0][0], c[:3] + [(c[3] + 1) % 200] + c[4:])]  # rows after a changed token were never computed
    assert trainer._recorded(last_changed, [0]) is not None and trainer._recorded(mid_changed, [0]) is None


def test_refused_after_a_weight_change_or_an_update():
    model, trainer, engine, pairs = _setup()
    idx = list(range(len(pairs)))
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] += 1e-3  # the policy moved; the engine was not synced
    trainer.scheduler.step()  # a new optimizer step: checked again
    assert trainer._recorded(pairs, idx) is None and trainer.rollout._steps == []  # stale records are dropped
    model2, trainer2, engine2, pairs2 = _setup()
    engine2.update_weights(copy.deepcopy(model2).state_dict(), version=1)  # a weight load clears the record
    assert trainer2._recorded(pairs2, idx) is None


def test_not_attached_to_an_engine_whose_forward_differs():
    model, tok = load_policy("tiny-llama")
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(), TrainConfig(autocast="none"))
    assert not trainer.reuse_rollout_forward(LLMEngine(model, dtype="bfloat16", tokenizer=tok, num_kv_blocks=16))
    assert not trainer.reuse_rollout_forward(LLMEngine(model, tokenizer=tok, num_kv_blocks=16, kv_cache_dtype="int8"))


def test_a_full_step_matches_the_step_without_recording():
    model, trainer, engine, pairs = _setup()
    base = copy.deepcopy(model)
    from longhaul.types import Trajectory, Turn

    groups = [[Trajectory([Turn(p, c, [-1.0] * len(c), [0] * len(c), [1] * len(c))], float(i % 2), 0) for i, (p, c) in enumerate(pairs)]]
    m1 = trainer.step(groups)
    plain = GRPOTrainer(base, trainer.pad_id, trainer.algo, trainer.train_cfg, temperature=0.8)
    m2 = plain.step(groups)
    for k in ("loss", "kl", "entropy", "grad_norm"):
        assert abs(m1[k] - m2[k]) <= 1e-5 * max(1.0, abs(m2[k])), k
