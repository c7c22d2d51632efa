"""Block-quantized weights (`inference/quant_blocks.py`) and their native kernel
(`ops/csrc/small_gemm_blocks.cpp`): quantization equal to gguf-py's implementation of llama.cpp's
reference rounding, GGUF block bytes decoded without loss, and the kernel against an fp64
product of the activations on the int8 grid and the dequantized weight, on each path the host
runs (the AVX2 one on every host)."""

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import quantize as gguf_quantize

from longhaul.errors import LonghaulError
from longhaul.inference import quant_blocks as qb
from longhaul.ops.linear import amx
from tests.ops.test_small_gemm_int8 import _grid

TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
         "q4_1": gguf.GGMLQuantizationType.Q4_1}


@pytest.fixture(params=[8, 16], ids=["avx2-panels", "vnni-panels"])
def nr(request, native):
    if request.param == 16 and not native.has_avx512_vnni():
        pytest.skip("this CPU has no AVX512-VNNI: the 16-wide panels do not run here")
    return request.param


@pytest.mark.parametrize("name", list(qb.FORMATS))
def test_quantize_equals_gguf_py_and_decode_reads_its_bytes(name):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(24, 96, generator=gen) * 0.05
    w[3, :32] = 0.0  # an all-zero block: d = 0
    w[5, 40] = 0.9  # an outlier
    raw = gguf_quantize(w.numpy(), TYPES[name])
    u, d, m = qb.decode(raw, name, 24, 96)
    mine = qb.quantize(w, name)
    assert torch.equal(mine[0], u) and torch.equal(mine[1], d)
    assert (m is None) == (mine[2] is None) and (m is None or torch.equal(mine[2], m))
    ref = torch.from_numpy(gguf.quants.dequantize(raw, TYPES[name])).reshape(24, 96)
    torch.testing.assert_close(qb.dequantize(u, d, m, name), ref, rtol=0, atol=1e-7)
    step = {"q8_0": 1 / 127, "q4_0": 1 / 8, "q4_1": 1 / 15}[name]
    err = (qb.dequantize(u, d, m, name) - w).abs().max()
    assert err <= step * w.abs().max() * 1.01  # within a step of the block's scale


@pytest.mark.parametrize("name", list(qb.FORMATS))
@pytest.mark.parametrize("m_rows", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(48, 96), (37, 64), (130, 576)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_gemm_equals_fp64_product_on_the_activation_grid(native, nr, name, m_rows, n, k, dtype):
    gen = torch.Generator().manual_seed(m_rows * 100 + n + k)
    w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    x = torch.randn(m_rows, k, generator=gen).to(dtype)
    for bias in (None, b):
        lin = qb.BlockLinear.from_float(w, name, bias, nr=nr)
        got = lin(x)
        assert got.shape == (m_rows, n) and got.dtype == dtype
        wq, xq = lin.dequantize(torch.float64), _grid(x)[0]
        want = xq @ wq.T + (0 if bias is None else b.double())
        scale = xq.abs() @ wq.abs().T + (0 if bias is None else b.double().abs())
        # integer sums a group; fp32 products with d (fp16, exact in fp32) and s, summed over groups
        rel = 2 ** -8 if dtype == torch.bfloat16 else 1e-6
        err = (got.double() - want).abs()
        assert (err <= rel * want.abs() + 2e-6 * scale + 1e-30).all(), (err - rel * want.abs()).max()


def test_calls_over_native_rows_take_the_dequantized_weight(native):
    w = torch.randn(40, 64)
    lin = qb.BlockLinear.from_float(w, "q4_1")
    assert lin.native_rows == (16 if amx() else 1 << 30)  # AMX hosts prefill on oneDNN's tiles
    lin.native_rows = 16
    x = torch.randn(30, 64)
    torch.testing.assert_close(lin(x), x @ lin.dequantize().T, rtol=1e-5, atol=1e-5)


def test_prefill_on_the_kernel_gives_each_row_its_single_row_result(native):
    lin = qb.BlockLinear.from_float(torch.randn(40, 64), "q4_0")
    lin.native_rows = 1 << 30
    x = torch.randn(200, 64)
    assert torch.equal(lin(x), torch.cat([lin(x[i:i + 1]) for i in range(200)]))


def test_concat_fuses_rows_and_refuses_mixed_formats():
    a, b = qb.BlockLinear.from_float(torch.randn(8, 32), "q4_0"), qb.BlockLinear.from_float(torch.randn(4, 32), "q4_0")
    fused = qb.concat([a, b])
    torch.testing.assert_close(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with pytest.raises(LonghaulError, match="cannot fuse"):
        qb.concat([a, qb.BlockLinear.from_float(torch.randn(4, 32), "q8_0")])


def test_bad_input_gets_one_line():
    with pytest.raises(LonghaulError, match="unknown block format 'q3_k'"):
        qb.fmt("q3_k")
    with pytest.raises(LonghaulError, match="divisible by 32"):
        qb.quantize(torch.randn(4, 40), "q4_0")


def test_decode_reads_the_shipped_layout_of_a_4_bit_block():
    """One Q4_1 block by hand: d = 0.5, m = -1, byte j holds value j (low nibble) and j + 16 (high)."""
    codes = np.arange(32) % 16
    qs = (codes[:16] | (codes[16:] << 4)).astype(np.uint8)
    raw = np.concatenate([np.array([0.5, -1.0], dtype=np.float16).view(np.uint8), qs])
    u, d, m = qb.decode(raw, "q4_1", 1, 32)
    assert u[0].tolist() == codes.tolist()
    torch.testing.assert_close(qb.dequantize(u, d, m, "q4_1")[0], torch.tensor(codes * 0.5 - 1.0, dtype=torch.float32))
