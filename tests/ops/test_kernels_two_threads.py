"""The native kernels on two threads. The suite runs tiny models on one torch thread
(conftest.py), where a kernel's parallel loop runs on the calling thread alone; here each kernel
runs with two, so the panels and attention tasks that land on the other thread are checked too.

A decode GEMM computes each output on one thread, so its two-thread result equals its
one-thread result bit for bit; attention splits a context by the thread count, so it is held to
the fp64 softmax instead."""

import pytest
import torch

from longhaul.inference.quant import quantize_linear
from longhaul.inference.quant_blocks import FORMATS, BlockLinear
from longhaul.ops.linear import SmallBatchLinear, SmallBatchLinearBF16

from tests.ops.conftest import cache_with


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _linears(native, w, b):
    out = {"fp32": SmallBatchLinear(w, b, native), "int8": quantize_linear(w, b)[0]}
    if native.has_avx512_bf16():
        out["bf16"] = SmallBatchLinearBF16(w.bfloat16(), b.bfloat16(), native, "dp")
    out["bf16-widen"] = SmallBatchLinearBF16(w.bfloat16(), b.bfloat16(), native, "widen")
    out.update({name: BlockLinear.from_float(w, name, b) for name in FORMATS})
    return out


@pytest.mark.parametrize("m", [1, 5, 9])
def test_decode_gemms_on_two_threads_equal_one_thread(native, two_threads, m):
    gen = torch.Generator().manual_seed(m)
    w, b = torch.randn(1000, 576, generator=gen) * 0.05, torch.randn(1000, generator=gen)  # 63+ panels: both threads take some
    x = torch.randn(m, 576, generator=gen)
    for name, lin in _linears(native, w, b).items():
        xi = x.bfloat16() if name.startswith("bf16") else x
        torch.set_num_threads(2)
        two = lin(xi)
        torch.set_num_threads(1)
        one = lin(xi)
        assert two.shape == (m, 1000) and (one != 0).any(), name
        assert torch.equal(two, one), f"{name}: {(two.float() - one.float()).abs().max().item():.3g} apart"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens", [[100], [70, 0], [1500], [3, 300, 40]])
def test_decode_attention_on_two_threads_equals_fp64_softmax(native, two_threads, dtype, lens):
    hq, hkv, d = 9, 3, 64
    kv, tables, ctx = cache_with(lens, hkv, d, seed=len(lens), dtype=dtype)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(7)).to(dtype)
    got = native.decode_attention(q, kv.k[0], kv.v[0], tables, ctx, kv.block_size, d ** -0.5)
    k, v = kv.gather(0, tables)  # (B, L, Hkv, D)
    for i, n in enumerate(lens):
        if n == 0:
            assert (got[i] == 0).all()
            continue
        qb = q[i].double().view(hkv, hq // hkv, d)
        w = torch.softmax(torch.einsum("hgd,nhd->hgn", qb, k[i, :n].double()) * d ** -0.5, -1)
        want = torch.einsum("hgn,nhd->hgd", w, v[i, :n].double()).reshape(hq, d)
        # fp32 arithmetic on values ~1; bf16 adds one rounding of the output (2^-8 relative)
        rtol = 2.0 ** -8 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(got[i].double(), want, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("dtype,quant", [("float32", None), ("bfloat16", None), ("bfloat16", "q4_0"), ("float32", "int8")])
def test_native_decode_step_on_two_threads_equals_the_python_layers(native, two_threads, dtype, quant):
    """The step's raw kernel calls share one buffer and per-thread scratch across both threads:
    its logits equal the per-layer Python path's, run on the same two threads, bit for bit."""
    from longhaul.inference import LLMEngine
    from longhaul.models import load_policy
    from tests.ops.test_decode_step import _steps

    model, _ = load_policy("tiny-llama")
    runner = LLMEngine(model, dtype=dtype, quantization=quant, adaptive_threads=False, num_kv_blocks=8, block_size=4).runner
    assert runner._native_layers is not None and torch.get_num_threads() == 2
    fused = _steps(runner, True)
    runner.kv.k.zero_(), runner.kv.v.zero_()
    plain = _steps(runner, False)
    assert torch.equal(fused, plain), (fused - plain).abs().max()


@pytest.mark.parametrize("dtype,quant", [("bfloat16", None), ("float32", "int8"), ("bfloat16", "q4_0")])
def test_whole_decode_step_on_two_threads_equals_forward_then_sample(native, two_threads, dtype, quant):
    """The whole step's head, logits and per-row draws on two threads: tokens and log-probabilities
    equal the runner's forward and `sampling.sample` on the same two, bit for bit."""
    from tests.ops.test_decode_sample import whole_equals_general

    assert torch.get_num_threads() == 2
    whole_equals_general("tiny-llama", dtype, quant)
