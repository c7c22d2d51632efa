"""The native bf16 decode GEMM (`csrc/small_gemm_bf16.cpp`, `linear.SmallBatchLinearBF16`): each
path the host can run against an fp64 matmul of the same bf16 inputs, the AVX2 path forced on
every host, and `pack`'s choice for bf16 decode weights."""

import pytest
import torch
import torch.nn.functional as F

from longhaul.ops.linear import PackedLinear, SmallBatchLinearBF16, pack


@pytest.fixture(params=["widen", "dp"])
def kind(request, native):
    if request.param == "dp" and not native.has_avx512_bf16():  # its instructions cannot execute here; refused, below
        pytest.skip("this CPU has no AVX512-BF16: the dp panels do not run here")
    return request.param


def _reference(x, w, b):
    """fp64 sums of the bf16 products the kernel computes (x is rounded to bf16 first)."""
    ref = x.bfloat16().double() @ w.double().T
    return ref if b is None else ref + b.double()


@pytest.mark.parametrize("n,k", [(576, 576), (37, 40), (100, 1536), (16, 2), (1, 8), (49, 24)])
@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 16, 33])
def test_bf16_gemm_equals_fp64_matmul(native, kind, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w, b = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(n, generator=gen).bfloat16()
    for bias in (None, b):
        lin = SmallBatchLinearBF16(w, bias, native, kind)
        got = lin(x)
        assert got.shape == (m, n) and got.dtype == torch.bfloat16
        want = _reference(x, w, bias)
        # one rounding to bf16 (2^-8 relative) of an fp32 sum (a few fp32 ulps of the absolute sum)
        scale = x.double().abs() @ w.double().abs().T
        err = (got.double() - want).abs()
        assert (err <= 2 ** -8 * want.abs() + 1e-6 * scale + 1e-30).all(), (err - 2 ** -8 * want.abs()).max()


def test_odd_k_runs_on_the_widen_path_and_the_dp_path_refuses_it(native):
    w, x = torch.randn(20, 7).bfloat16(), torch.randn(3, 7).bfloat16()
    got = SmallBatchLinearBF16(w, None, native, "widen")(x)
    want = _reference(x, w, None)
    assert ((got.double() - want).abs() <= 2 ** -8 * want.abs() + 1e-5).all()
    if native.has_avx512_bf16():
        with pytest.raises(RuntimeError, match="even K"):
            native.pack_bf16(w, "dp")
    else:
        with pytest.raises(RuntimeError, match="needs AVX512-BF16"):
            native.pack_bf16(torch.randn(20, 8).bfloat16(), "dp")


def test_calls_of_many_rows_go_to_onednn_and_agree(native):
    w, b = torch.randn(96, 64).bfloat16(), torch.randn(96).bfloat16()
    lin = SmallBatchLinearBF16(w, b, native)
    x = torch.randn(2, 40, 64).bfloat16()  # 80 rows: the prefill shape
    got = lin(x)
    # oneDNN packs bf16 only where it has a bf16 path (not on an AVX2-only CPU): there the kernel takes every call
    assert got.shape == (2, 40, 96) and (lin.large is None or isinstance(lin.large, PackedLinear))
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float(), b.float()), rtol=2e-2, atol=2e-2)
    assert lin(torch.randn(0, 64).bfloat16()).shape == (0, 96)


def test_pack_picks_the_bf16_kernel_for_decode_weights(native, monkeypatch):
    monkeypatch.delenv("LONGHAUL_GEMM_PANEL", raising=False)
    w = torch.randn(32, 16).bfloat16()
    got = pack(w)[0]
    assert isinstance(got, SmallBatchLinearBF16)
    assert got.weight.dim() == (4 if native.has_avx512_bf16() else 3)  # dp where the CPU has it
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", "8")  # the AVX2 path, forced on any host
    assert pack(w)[0].weight.dim() == 3
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", "16")
    if native.has_avx512_bf16():
        assert pack(w)[0].weight.dim() == 4
    else:  # refused, not silently narrowed
        with pytest.raises(RuntimeError, match="needs AVX512-BF16"):
            pack(w)
    monkeypatch.delenv("LONGHAUL_GEMM_PANEL")
    assert not isinstance(pack(w, few_rows=False)[0], SmallBatchLinearBF16)  # big forwards keep oneDNN (or F.linear)
