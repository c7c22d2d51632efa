"""An engine keeps only the packed form of its projections (`ModelRunner.drop_plain`): what it
drops reads back exactly, and full and partial weight updates equal a fresh engine."""

import pytest
import torch
from test_engine import lively

from longhaul.inference import LLMEngine
from longhaul.inference.model_runner import _PROJECTIONS, _unpackable
from longhaul.inference.sampling import SamplingParams
from longhaul.ops.kernels import native

PROMPTS = ["def fib(n):\n    return", "hello there", "a much longer prompt with several words"]
HF = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
      "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def greedy(n=12):
    return SamplingParams(temperature=0, max_tokens=n)


def _panels():
    k = native()
    return ["", "8"] + (["16"] if k is not None and k.has_avx512_bf16() else [])


@pytest.fixture(scope="module")
def llama():
    return lively("tiny-llama")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("panel", _panels())
def test_dropped_projections_read_back_exactly(llama, dtype, panel, monkeypatch):
    model, tok = llama
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", panel) if panel else monkeypatch.delenv("LONGHAUL_GEMM_PANEL", raising=False)
    eng = LLMEngine(model, dtype=dtype, tokenizer=tok, num_kv_blocks=32)
    r, want = eng.runner, model.state_dict()
    dropped = [(i, a) for i, L in enumerate(r.layers) for a in _PROJECTIONS if getattr(L, a) is None]
    packable = [(i, a) for i, row in enumerate(r._exec) for a, at in _PROJECTIONS.items() if _unpackable(row[at])]
    assert dropped == packable  # every projection that can be read back was dropped, and only those
    targets = r.targets()
    for i, a in dropped:
        for name in (f"model.layers.{i}.{p}.weight" for p in HF[a]):
            t, r0, r1 = targets[name]
            assert torch.equal(t[r0:r1], want[name].to(r.dtype)), name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_full_and_partial_updates_of_dropped_projections_equal_a_fresh_engine(llama, dtype):
    model, tok = llama
    new, _ = lively("tiny-llama")
    with torch.no_grad():
        for n, p in new.named_parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    fresh = [o.token_ids for o in LLMEngine(new, dtype=dtype, tokenizer=tok, num_kv_blocks=64).generate(PROMPTS, greedy())]
    eng = LLMEngine(model, dtype=dtype, tokenizer=tok, num_kv_blocks=64)
    assert [o.token_ids for o in eng.generate(PROMPTS, greedy())] != fresh
    eng.update_weights(new.state_dict(), version=1)
    assert [o.token_ids for o in eng.generate(PROMPTS, greedy())] == fresh
    assert all(getattr(L, a) is None for L in eng.runner.layers for a in _PROJECTIONS
               if _unpackable(eng.runner._exec[0][_PROJECTIONS[a]]))  # dropped again after the re-pack

    # only k_proj and up_proj of every layer change: the other rows of their fused groups are kept
    part = {n: t for n, t in model.state_dict().items() if n.endswith(("k_proj.weight", "up_proj.weight"))}
    mixed = {**new.state_dict(), **part}
    new.load_state_dict(mixed)
    fresh = [o.token_ids for o in LLMEngine(new, dtype=dtype, tokenizer=tok, num_kv_blocks=64).generate(PROMPTS, greedy())]
    assert [o.token_ids for o in eng.generate(PROMPTS, greedy())] != fresh
    eng.update_weights(part, version=2)
    assert [o.token_ids for o in eng.generate(PROMPTS, greedy())] == fresh
