"""Quantized rollouts (`rollout.quantization`): the sampler engine runs quantized linears, a
weight sync re-quantizes them from the new weights, and a GRPO step on its samples reports the
gap between the sampler's and the trainer's log-probs and trains through the TIS correction."""

import math

import pytest
import torch

from longhaul.config import AlgoConfig, RunConfig, TrainConfig
from longhaul.errors import LonghaulError
from longhaul.inference import RolloutParams, generate, sync_weights
from longhaul.inference.quant import Int8Linear
from longhaul.inference.quant_blocks import BlockLinear
from longhaul.models import load_policy
from longhaul.rl.grpo import GRPOTrainer
from longhaul.runtime.rollout import make_sampler
from longhaul.types import Trajectory, Turn


def _cfg(quant, sampler="engine"):
    return RunConfig.model_validate({"model": {"name": "tiny-llama"},
                                     "rollout": {"quantization": quant, "dtype": "float32", "sampler": sampler}})


@pytest.mark.parametrize("quant,kind", [("int8", Int8Linear), ("q4_1", BlockLinear)])
def test_quantized_sampler_resyncs_and_its_gap_is_reported(quant, kind):
    policy, tok = load_policy("tiny-llama")
    engine = make_sampler(_cfg(quant), policy, tok)
    qkv = engine.runner._exec[0][1]
    assert isinstance(qkv, kind) and isinstance(engine.runner._lm_head, kind)
    with torch.no_grad():  # a weight sync re-quantizes from the policy's new weights
        policy.model.layers[0].self_attn.q_proj.weight.mul_(-1)
    sync_weights(engine, policy, version=1)
    new = engine.runner._exec[0][1]
    rows = policy.model.layers[0].self_attn.q_proj.weight.shape[0]
    got = new.dequantize()[:rows]
    want = policy.model.layers[0].self_attn.q_proj.weight
    assert (got - want).abs().max() <= 0.1 * want.abs().max()  # within the format's step of the new weights

    prompt = tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").input_ids
    outs = generate(engine, tok, [prompt] * 4, RolloutParams(max_new_tokens=6, temperature=1.0), seed=3)
    group = [Trajectory([Turn(prompt, o.token_ids, o.logprobs, [1] * len(o.token_ids), [1] * len(o.token_ids))], float(i % 2), 1)
             for i, o in enumerate(outs)]
    trainer = GRPOTrainer(policy, tok.pad_token_id, AlgoConfig(kl_coef=0.0, tis_cap=2.0), TrainConfig(autocast="none", lr=1e-3))
    m = trainer.step([group])
    # the sampler's log-probs differ from the fp32 trainer's by the quantization, not by nothing
    assert 0 < m["logprob_gap"] < 1 and math.isfinite(m["loss"]) and m["grad_norm"] > 0


def test_the_hf_sampler_refuses_quantization():
    policy, tok = load_policy("tiny-llama")
    with pytest.raises(LonghaulError, match="needs rollout.sampler engine"):
        make_sampler(_cfg("int8", sampler="hf"), policy, tok)
