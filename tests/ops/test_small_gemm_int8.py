"""The native int8 weight-only decode GEMM (`csrc/small_gemm_int8.cpp`, `Int8Linear.use_native`):
against an fp64 matmul of the dequantized weights on each panel width the host runs (the AVX2
one on every host), and the engine's int8 packer taking it."""

import pytest
import torch

from longhaul.inference.quant import Int8Linear, quantize_linear


@pytest.fixture(params=[8, 16], ids=["avx2-panels", "avx512-panels"])
def nr(request, native):
    if request.param == 16 and not native.has_avx512():
        pytest.skip("this CPU has no AVX-512: the 16-wide panels do not run here")
    return request.param


@pytest.mark.parametrize("n,k", [(576, 576), (37, 40), (100, 1536), (1, 7), (49, 24)])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_gemm_equals_fp64_matmul_of_the_dequantized_weight(native, nr, m, n, k, dtype):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    for bias in (None, b):
        lin = Int8Linear.from_float(w, bias).use_native(native, nr)
        got = lin(x)
        assert got.shape == (m, n) and got.dtype == dtype
        want = x.double() @ lin.dequantize(torch.float64).T
        if bias is not None:
            want = want + b.double()
        scale = x.double().abs() @ lin.dequantize(torch.float64).abs().T + (0 if bias is None else b.double().abs())
        # fp32 sums (a few ulps of the absolute sum), then the output dtype's rounding
        rel = 2 ** -8 if dtype == torch.bfloat16 else 1e-6
        assert ((got.double() - want).abs() <= rel * want.abs() + 1e-5 * scale + 1e-30).all()


def test_more_rows_leave_the_kernel_and_agree(native):
    w = torch.randn(64, 32)
    lin, plain = Int8Linear.from_float(w).use_native(native), Int8Linear.from_float(w)
    for rows in (4, 40):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(lin(x), plain(x), rtol=1e-5, atol=1e-5)


def test_the_engine_packer_uses_the_kernel_and_refuses_bad_widths(native, monkeypatch):
    monkeypatch.delenv("LONGHAUL_GEMM_PANEL", raising=False)
    lin, left = quantize_linear(torch.randn(40, 16), torch.randn(40))
    assert left is None and lin._native is not None
    assert lin._native[1].shape[2] == (16 if native.has_avx512() else 8)
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", "8")
    assert quantize_linear(torch.randn(40, 16))[0]._native[1].shape[2] == 8
    with pytest.raises(RuntimeError, match="8 or 16"):
        native.pack_int8(torch.zeros(4, 4, dtype=torch.int8), 4)
