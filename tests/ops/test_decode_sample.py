"""`DecodeLayers.sample` (csrc/decode_step.cpp) through `ModelRunner.decode_sample`: a whole
decode step from token ids to sampled tokens in one call, bit for bit what the runner's forward
and then `sampling.sample` give, in every weight format with a native kernel; steps it cannot
reproduce return None, and bad calls are refused with one line."""

import pytest
import torch

from longhaul.inference import LLMEngine
from longhaul.inference.model_runner import BatchItem
from longhaul.models import load_policy
from longhaul.ops.linear import native_layers

from tests.ops.conftest import whole_equals_general


@pytest.mark.parametrize("dtype,quant", [("float32", None), ("bfloat16", None), ("float32", "int8"), ("bfloat16", "q4_1"),
                                         ("bfloat16", "q4_0"), ("float32", "q8_0")])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_whole_step_equals_forward_then_sample(native, name, dtype, quant):
    whole_equals_general(name, dtype, quant)


@pytest.mark.parametrize("temps", [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.5, 2.0, 1.0)])
def test_whole_step_at_other_temperatures(native, temps):
    whole_equals_general("tiny-llama", "bfloat16", None, temps=temps, steps=2)


def _runner(dtype="bfloat16"):
    model, _ = load_policy("tiny-llama")
    return LLMEngine(model, dtype=dtype, adaptive_threads=False, num_kv_blocks=12, block_size=4).runner


def test_steps_the_whole_call_cannot_take_return_none(native):
    runner = _runner()
    g = [torch.Generator()]
    assert runner.decode_sample([BatchItem([5, 9], 0, [0])], [1.0], g) is None  # two tokens: a chunk of prompt
    assert runner.decode_sample([BatchItem([5], 0, [0], num_logits=0)], [1.0], g) is None
    assert runner.decode_sample([BatchItem([5], 0, [0], lora=1)], [1.0], g) is None
    far = runner.rope.max_positions
    assert runner.decode_sample([BatchItem([5], far, [0] * (far // 4 + 1))], [1.0], g) is None
    runner.fused_step = False
    assert runner.decode_sample([BatchItem([5], 0, [0])], [1.0], g) is None
    runner.fused_step = True
    assert runner.decode_sample([BatchItem([5], 0, [0])], [1.0], g) is not None


def test_bad_calls_are_refused_with_one_line(native):
    runner = _runner("float32")
    layers, kv = runner._native_layers[0], runner.kv
    g = torch.Generator()

    def call(ids=(5,), positions=(0,), tables=([0],), temps=(1.0,), gens=(g,), block_size=kv.block_size):
        return layers.sample(list(ids), list(positions), [list(t) for t in tables], kv.k, kv.v, block_size,
                             runner.num_heads, runner.eps, list(temps), list(gens))

    assert len(call()[0]) == 1
    for kwargs, why in [({"ids": (10_000,)}, "outside the vocabulary"), ({"positions": (10**7,)}, "past the RoPE tables"),
                        ({"positions": (4,)}, "past its block table"), ({"tables": ([99],)}, "outside the cache"),
                        ({"temps": (-1.0,)}, "negative or NaN"), ({"temps": (float("nan"),)}, "negative or NaN"),
                        ({"gens": ()}, "a sequence"), ({"block_size": 0}, "block size must be positive")]:
        with pytest.raises(RuntimeError, match=why):
            call(**kwargs)
    bare = native.DecodeLayers(native_layers(runner._exec)[0])
    assert not bare.has_head
    with pytest.raises(RuntimeError, match="without the model's head"):
        bare.sample([5], [0], [[0]], kv.k, kv.v, kv.block_size, runner.num_heads, runner.eps, [1.0], [g])


def test_a_head_of_another_float_dtype_keeps_the_general_path(native):
    runner = _runner("bfloat16")
    runner.pack_weights(head_packer=lambda w, b: (_fp32_head(runner, w), None))
    assert not runner._native_layers[0].has_head
    assert runner.decode_sample([BatchItem([5], 0, [0])], [1.0], [torch.Generator()]) is None


def _fp32_head(runner, w):
    from longhaul.ops.linear import SmallBatchLinear
    return SmallBatchLinear(w.float(), None, runner.native)
