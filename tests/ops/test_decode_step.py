"""`DecodeLayers` (csrc/decode_step.cpp): a decode step's layers in one native call give the
runner's per-layer Python path's logits bit for bit, in every weight format with a native
kernel; steps it cannot take (prefill chunks, a recorder, too many rows) keep the Python path."""

import pytest
import torch

from longhaul.inference import LLMEngine
from longhaul.inference.model_runner import BatchItem
from longhaul.models import load_policy


def _steps(runner, fused):
    """Prefill two prompts, then three decode steps of both; the decode steps' logits."""
    runner.fused_step = fused
    runner.forward(runner.prepare([BatchItem([5, 9, 2, 7, 1], 0, [0, 1]), BatchItem([4, 4, 8], 0, [2, 3])]))
    out = []
    for step in range(3):
        items = [BatchItem([11 + step], 5 + step, [0, 1]), BatchItem([20 + step], 3 + step, [2, 3])]
        out.append(runner.forward(runner.prepare(items)))
    return torch.cat(out)


@pytest.mark.parametrize("dtype,quant", [("float32", None), ("bfloat16", None), ("float32", "int8"), ("bfloat16", "q4_1"),
                                         ("float32", "q8_0")])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_one_native_call_equals_the_python_layers(native, name, dtype, quant):
    model, _ = load_policy(name)
    engine = LLMEngine(model, dtype=dtype, quantization=quant, adaptive_threads=False, num_kv_blocks=8, block_size=4)
    runner = engine.runner
    assert runner._native_layers is not None
    fused = _steps(runner, True)
    runner.kv.k.zero_(), runner.kv.v.zero_()
    plain = _steps(runner, False)
    assert torch.equal(fused, plain), (fused - plain).abs().max()


def test_steps_it_cannot_take_keep_the_python_path(native, monkeypatch):
    model, _ = load_policy("tiny-llama")
    runner = LLMEngine(model, dtype="bfloat16", adaptive_threads=False, num_kv_blocks=64, block_size=4).runner
    calls = []
    layers, limit = runner._native_layers  # limit: the bf16 kernel's rows, where oneDNN takes larger calls
    assert len(layers) == len(runner.layers)
    monkeypatch.setattr(runner, "_native_layers", (_Counting(layers, calls), limit))
    runner.forward(runner.prepare([BatchItem([5, 9, 2], 0, [0])]))  # a prefill chunk
    assert "run" not in calls
    if limit < 64:
        many = [BatchItem([3], 0, [i]) for i in range(limit + 1)]
        runner.forward(runner.prepare(many))
        assert "run" not in calls
    runner.forward(runner.prepare([BatchItem([3], 0, [40]), BatchItem([4], 0, [41])]))
    assert "run" in calls


class _Counting:
    def __init__(self, mod, calls):
        self._mod, self._calls = mod, calls

    def __getattr__(self, name):
        self._calls.append(name)
        return getattr(self._mod, name)
