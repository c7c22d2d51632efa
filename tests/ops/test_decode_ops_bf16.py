"""The native decode-step ops in bf16 (`csrc/decode_ops.cpp`, `swiglu` in `csrc/train_ops.cpp`):
each against an fp64 computation over the same bf16 inputs, with the tolerance of the roundings
the kernel makes (one rounding to bf16 is at most 2^-8 relative, on top of fp32 arithmetic); and
the bf16 runner with and without them. These kernels need only AVX2, so every host that builds
the module runs every test here."""

import pytest
import torch
import torch.nn.functional as F

from longhaul.inference.kv_cache import KVCache
from longhaul.models import load_policy
from tests.ops.conftest import cache_with, runner_pair

HALF_ULP = 2.0 ** -8  # relative error of one rounding to nearest bf16


def _within(got, want, roundings, atol):
    err = (got.double() - want).abs()
    bound = roundings * HALF_ULP * want.abs() + atol
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("hq,hkv,d,lens", [(9, 3, 64, [1, 5, 17, 4, 33]), (4, 4, 16, [1, 5, 17, 4, 33]), (6, 2, 12, [1, 5, 17, 4, 33]),
                                            (2, 1, 128, [1, 5, 17, 4, 33]), (9, 3, 64, [1400, 3]), (2, 1, 128, [900]),
                                            (9, 3, 64, [100])])
def test_bf16_decode_attention_equals_fp64_softmax_attention(native, hq, hkv, d, lens):
    """Short contexts, and long ones split over threads (merged by log-sum-exp)."""
    kv, tables, ctx = cache_with(lens, hkv, d, seed=hq + d, dtype=torch.bfloat16)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(hq * d)).bfloat16()
    got = native.decode_attention(q, kv.k[0], kv.v[0], tables, ctx, kv.block_size, d ** -0.5)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    k, v = kv.gather(0, tables)  # (B, L, Hkv, D)
    for b, n in enumerate(lens):
        kb, vb = k[b, :n].double(), v[b, :n].double()  # (n, Hkv, D)
        qb = q[b].double().view(hkv, hq // hkv, d)
        w = torch.softmax(torch.einsum("hgd,nhd->hgn", qb, kb) * d ** -0.5, -1)
        want = torch.einsum("hgn,nhd->hgd", w, vb).reshape(hq, d)
        # one rounding of an fp32 softmax-weighted mean of |v| ~ 1 values
        _within(got[b], want, 1, 2e-5)


@pytest.mark.parametrize("n,e", [(1, 576), (8, 64), (3, 13)])
def test_bf16_rms_norm_equals_hf_in_fp64(native, n, e):
    gen = torch.Generator().manual_seed(n + e)
    x, w = (torch.randn(n, e, generator=gen) * 3).bfloat16(), torch.randn(e, generator=gen).bfloat16()
    got = native.rms_norm(x, w, 1e-5)
    assert got.dtype == torch.bfloat16
    xd = x.double()
    want = w.double() * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
    _within(got, want, 2, 1e-6)  # HF rounds x * r to bf16, then the product with w


def test_bf16_rope_and_cache_equal_fp64_rotation(native):
    hq, hkv, d, n = 6, 2, 64, 5
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(n, hq + 2 * hkv, d, generator=gen).bfloat16()
    angles = torch.rand(n, d // 2, generator=gen) * 10
    cos, sin = torch.cat([angles.cos()] * 2, -1).bfloat16(), torch.cat([angles.sin()] * 2, -1).bfloat16()
    slots = torch.tensor([7, 0, 3, 12, 5])
    kv = KVCache(1, 4, 4, hkv, d, dtype=torch.bfloat16)
    q = native.rope_and_cache(qkv, cos, sin, kv.k[0], kv.v[0], slots, hq)
    x, c, s = qkv.double(), cos.double()[:, None], sin.double()[:, None]
    rotated = x * c + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * s
    _within(q, rotated[:, :hq], 1, 1e-6)
    _within(kv.k[0][slots], rotated[:, hq:hq + hkv], 1, 1e-6)
    assert torch.equal(kv.v[0][slots], qkv[:, hq + hkv:])
    with pytest.raises(RuntimeError, match="of qkv's dtype"):
        native.rope_and_cache(qkv, cos, sin, kv.k[0].float(), kv.v[0].float(), slots, hq)


def test_bf16_swiglu_equals_fp64(native):
    gen = torch.Generator().manual_seed(5)
    n, f = 9, 203  # F not a multiple of 8: the scalar tail too
    gu = (torch.randn(n, 2 * f, generator=gen) * 4).bfloat16()
    gate, up = gu[:, :f], gu[:, f:]  # views of one fused projection, as the runner passes them
    got = native.swiglu(gate, up)
    assert got.dtype == torch.bfloat16
    _within(got, F.silu(gate.double()) * up.double(), 2, 1e-6)  # silu rounded, then the product
    with pytest.raises(RuntimeError, match="one dtype"):
        native.swiglu(gate, up.float())


def test_mixed_dtypes_are_refused(native):
    with pytest.raises(RuntimeError, match="both fp32 or both bf16"):
        native.rms_norm(torch.randn(2, 8).bfloat16(), torch.randn(8), 1e-5)
    kv, tables, ctx = cache_with([3], 1, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="of q's dtype"):
        native.decode_attention(torch.randn(1, 1, 8), kv.k[0], kv.v[0], tables, ctx, kv.block_size, 1.0)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_bf16_runner_with_and_without_the_kernels_agree(native, name):
    """Prefill chunks, then decode steps of three sequences in one batch, in bf16: the native
    attention, RMSNorm, RoPE + cache write and SwiGLU against torch's bf16 ops (gather + SDPA,
    F.rms_norm, apply_rope). The two round at different places (torch after every op, the kernels
    once an op), so logits agree to bf16 noise, not bitwise, and the greedy tokens match."""
    model, _ = load_policy(name)
    runners, outs = runner_pair(model, torch.bfloat16)
    assert runners[0]._native_cache() and not runners[1]._native_cache()
    scale = outs[1].abs().max()
    assert (outs[0] - outs[1]).abs().max() <= 0.01 * scale  # ~0.003 of it measured: a bf16 ulp of the largest logit
    assert (outs[0].argmax(-1) == outs[1].argmax(-1)).float().mean() >= 0.9
