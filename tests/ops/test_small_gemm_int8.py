"""The native int8 decode GEMM (`csrc/small_gemm_blocks.cpp` with one scale an output,
`Int8Linear.use_native`): activations
quantized per 32 values, integer dot products. Against an fp64 matmul of the activations on the
same int8 grid (computed here the way the kernel computes it, in fp32) and the dequantized
weights, on each path the host runs (the AVX2 one on every host); the distance to the
unquantized product within the grid's bound; the engine's int8 packer taking it."""

import pytest
import torch

from longhaul.inference.quant import Int8Linear, quantize_linear
from longhaul.ops.linear import amx


@pytest.fixture(params=[8, 16], ids=["avx2-panels", "vnni-panels"])
def nr(request, native):
    if request.param == 16 and not native.has_avx512_vnni():
        pytest.skip("this CPU has no AVX512-VNNI: the 16-wide panels do not run here")
    return request.param


def _grid(x, group=32):
    """x (M, K) on the kernel's int8 grid, as fp64: per 32 values s = max|x| / 127 and
    round(x * (127 / max|x|)) * s, in fp32 as the kernel computes them (K padded with zeros)."""
    m, k = x.shape
    kp = -(-k // group) * group
    xf = torch.zeros(m, kp)
    xf[:, :k] = x.float()
    g = xf.view(m, kp // group, group)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    codes = (g * inv).round()
    return (codes.double() * (amax / 127).double()).view(m, kp)[:, :k], (amax / 127).double()


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
        wq, xq = lin.dequantize(torch.float64), _grid(x)[0]
        want = xq @ wq.T + (0 if bias is None else b.double())
        scale = xq.abs() @ wq.abs().T + (0 if bias is None else b.double().abs())
        # exact integer sums a group, fp32 sums over groups (a few ulps of the absolute sum), then
        # the output dtype's rounding
        rel = 2 ** -8 if dtype == torch.bfloat16 else 1e-6
        err = (got.double() - want).abs()
        assert (err <= rel * want.abs() + 1e-5 * scale + 1e-30).all(), (err - rel * want.abs()).max()


def test_int8_bias_is_added_after_the_scale_is_rounded(native, nr):
    """Per output: its scale's product rounded in fp32, then the bias added and rounded (as a
    multiply, then an add): the same bits as the kernel without a bias plus the bias."""
    gen = torch.Generator().manual_seed(7)
    w, b = torch.randn(300, 576, generator=gen), torch.randn(300, generator=gen)
    x = torch.randn(3, 576, generator=gen)
    plain = Int8Linear.from_float(w).use_native(native, nr)(x)
    biased = Int8Linear.from_float(w, b).use_native(native, nr)(x)
    assert torch.equal(biased, plain + b)


def test_a_bias_of_the_wrong_length_is_refused(native):
    lin = Int8Linear.from_float(torch.randn(40, 64)).use_native(native, 8)
    with pytest.raises(RuntimeError, match="the bias must have N = 40 values, got 39"):
        native.mm_blocks(torch.randn(1, 64), lin._native[1], lin.scale, torch.empty(0), 8, 128, 40, torch.randn(39))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_gemm_stays_within_the_activation_grid_of_the_float_product(native, nr, dtype):
    """Against x itself: each value moves at most half its group's step, so the product moves at
    most sum_k s_g(k) / 2 * |W_jk|; an outlier in a group coarsens only that group."""
    gen = torch.Generator().manual_seed(7)
    w, x = torch.randn(96, 200, generator=gen), torch.randn(5, 200, generator=gen).to(dtype)
    x[0, 3] = 40.0
    lin = Int8Linear.from_float(w).use_native(native, nr)
    wq, (xq, step) = lin.dequantize(torch.float64), _grid(x)
    half = (step / 2).expand(-1, -1, 32).reshape(5, -1)[:, :200]
    bound = half @ wq.abs().T
    err = (lin(x).double() - x.double() @ wq.T).abs()
    rel = 2 ** -8 if dtype == torch.bfloat16 else 1e-6
    assert (err <= bound * 1.001 + rel * (x.double() @ wq.T).abs() + 1e-5).all()
    assert (xq - x.double()).abs().max() > 0  # the grid is real: x is not representable exactly


def test_more_rows_than_native_rows_leave_the_kernel_and_agree(native):
    """Calls of more rows than `native_rows` (16 on an AMX CPU) multiply unquantized activations."""
    w = torch.randn(64, 32)
    lin, plain = Int8Linear.from_float(w).use_native(native), Int8Linear.from_float(w)
    lin.native_rows = 16
    x = torch.randn(40, 32)
    torch.testing.assert_close(lin(x), plain(x), rtol=1e-5, atol=1e-5)


def test_without_amx_every_call_runs_the_kernel_row_by_row_alike(native):
    """Elsewhere the kernel takes prefill-sized calls too, and a row's result does not depend on
    the rows beside it (each row's activations are quantized on their own)."""
    lin = Int8Linear.from_float(torch.randn(64, 96)).use_native(native)
    assert lin.native_rows == (16 if amx() else 1 << 30)
    lin.native_rows = 1 << 30
    x = torch.randn(300, 96)
    whole = lin(x)
    assert torch.equal(whole, torch.cat([lin(x[i:i + 1]) for i in range(300)]))


def test_the_engine_packer_uses_the_kernel_and_refuses_bad_widths(native, monkeypatch):
    monkeypatch.delenv("LONGHAUL_GEMM_PANEL", raising=False)
    lin, left = quantize_linear(torch.randn(40, 16), torch.randn(40))
    assert left is None and lin._native is not None
    assert lin._native[1].shape[1] == 32 * (16 if native.has_avx512_vnni() else 8)  # one group of 32 k, nr outputs
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", "8")
    assert quantize_linear(torch.randn(40, 16))[0]._native[1].shape[1] == 32 * 8
    with pytest.raises(RuntimeError, match="8 or 16"):
        native.pack_blocks(torch.zeros(4, 4, dtype=torch.uint8), torch.empty(0), torch.empty(0), 8, 128, 4)
    with pytest.raises(RuntimeError, match="per-channel"):
        native.pack_blocks(torch.zeros(4, 4, dtype=torch.uint8), torch.empty(0), torch.empty(0), 4, 8, 8)
