"""INT8 weights and INT8/INT4 KV tensors (`longhaul.inference.quant`) against float references.

Stated bounds:
- round to nearest: |x - dequant(quant(x))| <= scale / 2 elementwise, for weights and KV, every
  mode (checked with a 1e-5 relative slack for float32 arithmetic);
- Int8Linear vs the float linear: |y - x @ W.T| <= ||x||_1 * scale / 2 per output (the
  elementwise bound summed), and under 2% relative (Frobenius) for Gaussian weights;
- Int8Linear vs dequantize-then-matmul: 1e-5 relative for float32 inputs, 1e-2 for bf16
  (the kernel rounds to bf16).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longhaul.errors import LonghaulError
from longhaul.inference.quant import (
    KV_PRESETS,
    Int8Linear,
    KVQuant,
    dequantize_kv,
    int8_per_channel,
    kv_preset,
    pack_int4,
    quantize_kv,
    quantize_weights,
    quantized_prefix,
    unpack_int4,
)
from longhaul.models import load_policy


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- INT8 weights ----------------------------------------------------------------------------


def test_int8_per_channel_round_trip_within_half_scale():
    w = torch.randn(48, 80, generator=gen()) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different size
    codes, scale = int8_per_channel(w)
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (48,)
    assert codes.abs().max() <= 127
    err = (codes.float() * scale[:, None] - w).abs()
    ratio = (err / scale[:, None]).max().item()
    assert ratio <= 0.5 + 1e-5, f"max |err| / scale = {ratio}"


@pytest.mark.parametrize("shape", [(7, 64), (2, 3, 64), (1, 64)])
def test_int8_linear_fp32_equals_dequantize_then_matmul(shape):
    w, b = torch.randn(96, 64, generator=gen(1)), torch.randn(96, generator=gen(2))
    lin = Int8Linear.from_float(w, b)
    x = torch.randn(*shape, generator=gen(3))
    y, ref = lin(x), F.linear(x, lin.dequantize(), b)
    assert y.shape == (*shape[:-1], 96) and y.dtype == torch.float32
    diff = (y - ref).abs().max().item() / ref.abs().max().item()
    assert diff <= 1e-5, f"relative max diff {diff}"


def test_int8_linear_close_to_float_linear():
    w = torch.randn(256, 128, generator=gen(4)) * 0.05
    x = torch.randn(16, 128, generator=gen(5))
    lin = Int8Linear.from_float(w)
    y, ref = lin(x), F.linear(x, w)
    bound = x.abs().sum(-1, keepdim=True) * lin.scale[None, :] / 2  # (16, 256)
    excess = ((y - ref).abs() - bound * (1 + 1e-5) - 1e-6).max().item()
    assert excess <= 0, f"error exceeds ||x||_1 * scale / 2 by {excess}"
    assert rel(y, ref) < 0.02, f"relative error {rel(y, ref)}"


def test_int8_linear_bf16_uses_kernel_and_matches_reference():
    w = torch.randn(160, 96, generator=gen(6)) * 0.05
    lin = Int8Linear.from_float(w)
    xb = torch.randn(2, 5, 96, generator=gen(7)).bfloat16()
    y = lin(xb)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 5, 160)
    ref = F.linear(xb.float(), lin.dequantize())
    assert rel(y, ref) < 1e-2, f"bf16 relative error {rel(y, ref)}"
    # bf16 scales (a model cast with .to(bfloat16)) go through the same kernel
    assert rel(lin.to(torch.bfloat16)(xb), ref) < 1e-2
    many = torch.randn(Int8Linear.KERNEL_ROWS + 8, 96, generator=gen(18)).bfloat16()  # the cast path
    assert rel(lin(many), F.linear(many.float(), lin.dequantize())) < 1e-2


def test_fp32_int8pack_kernel_agrees_with_the_cast_path():
    """The float32 kernel exists (and is slow on CPU); it computes what the fallback computes."""
    lin = Int8Linear.from_float(torch.randn(32, 48, generator=gen(8)))
    x = torch.randn(4, 48, generator=gen(9))
    kern = torch._weight_int8pack_mm(x, lin.codes, lin.scale)
    assert (kern - lin(x)).abs().max().item() <= 1e-5 * lin(x).abs().max().item()


def test_int8_linear_rejects_non_matrix():
    with pytest.raises(LonghaulError, match="2-D"):
        Int8Linear.from_float(torch.randn(4, 4, 4))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_quantize_weights_model_swaps_projections_and_stays_close(name):
    model, _ = load_policy(name)
    model.eval()
    ids = torch.randint(0, 200, (2, 24), generator=gen(10))
    with torch.no_grad():
        ref = model(ids).logits
        quantize_weights(model)
        out = model(ids).logits
    swapped = [n for n, m in model.named_modules() if isinstance(m, Int8Linear)]
    assert len(swapped) == 7 * model.config.num_hidden_layers
    assert not any("lm_head" in n for n in swapped)
    assert rel(out, ref) < 0.02, f"logits relative error {rel(out, ref)}"


def test_quantize_weights_state_dict_folds_bias_and_honours_skip():
    model, _ = load_policy("tiny-qwen2")  # q/k/v carry biases
    sd = model.state_dict()
    q = quantize_weights(sd, lm_head=True, skip=("layers.1.",))
    key = "model.layers.0.self_attn.q_proj"
    assert isinstance(q[key + ".weight"], Int8Linear) and key + ".bias" not in q
    assert torch.equal(q[key + ".weight"].bias, sd[key + ".bias"])
    assert isinstance(q["model.layers.1.self_attn.q_proj.weight"], torch.Tensor)
    assert isinstance(q["lm_head.weight"], Int8Linear)
    assert q["model.norm.weight"] is sd["model.norm.weight"]
    x = torch.randn(3, model.config.hidden_size, generator=gen(11))
    ref = F.linear(x, sd[key + ".weight"], sd[key + ".bias"])
    assert rel(q[key + ".weight"](x), ref) < 0.02


def test_quantize_weights_refuses_a_model_without_projections():
    with pytest.raises(LonghaulError, match="no linear"):
        quantize_weights(torch.nn.Sequential(torch.nn.Linear(4, 4)))


# ---- INT8 / INT4 KV --------------------------------------------------------------------------


def test_pack_int4_exact():
    codes = torch.randint(0, 16, (3, 5, 64), generator=gen(12), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (3, 5, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes)
    every_byte = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_int4(unpack_int4(every_byte)), every_byte)
    assert torch.equal(unpack_int4(torch.tensor([0x21], dtype=torch.uint8)), torch.tensor([1, 2], dtype=torch.uint8))


def test_pack_int4_needs_even_width():
    with pytest.raises(LonghaulError, match="even"):
        pack_int4(torch.zeros(3, 5, dtype=torch.uint8))


def _expand_scale(q, x):
    t, d = x.shape[-2:]
    if q.axis == "token":
        return q.scale.expand(*x.shape[:-1], d // q.group, q.group).reshape(x.shape)
    return q.scale.expand(*x.shape[:-2], t // q.group, q.group, d).reshape(x.shape)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("axis,group", [("token", None), ("token", 16), ("channel", 8), ("channel", None)])
@pytest.mark.parametrize("symmetric", [False, True])
def test_kv_round_trip_within_half_scale(bits, axis, group, symmetric):
    # (B, Hkv, T, D) with per-channel offsets like post-RoPE keys
    x = torch.randn(2, 3, 32, 64, generator=gen(13)) * 2 + torch.linspace(-4, 4, 64)
    q = quantize_kv(x, bits, axis, group, symmetric)
    assert q.shape == x.shape and q.codes.dtype == torch.uint8
    assert q.codes.shape[-1] == (64 if bits == 8 else 32)
    groups = 64 // (group or 64) if axis == "token" else 32 // (group or 32)
    assert q.scale.shape == ((2, 3, 32, groups, 1) if axis == "token" else (2, 3, groups, 1, 64))
    back = dequantize_kv(q)
    ratio = ((back - x).abs() / _expand_scale(q, x)).max().item()
    assert ratio <= 0.5 + 1e-5, f"max |err| / scale = {ratio}"
    levels = 2**bits - 1
    span = (x.abs().amax() * 2 / (levels - 1)) if symmetric else (x.amax() - x.amin()) / levels
    assert _expand_scale(q, x).max() <= span * (1 + 1e-6)  # a group's scale never exceeds the whole tensor's


def test_kv_keeps_dtype_and_constant_groups_exact():
    x = torch.randn(4, 16, 32, generator=gen(14)).bfloat16()
    assert dequantize_kv(quantize_kv(x, 4), torch.bfloat16).dtype == torch.bfloat16
    const = torch.full((2, 8, 16), 0.75)
    const[1] = 0.0
    for axis in ("token", "channel"):
        # asymmetric: code 0 and bias = the value; symmetric: zero exact, others to rounding
        assert torch.equal(dequantize_kv(quantize_kv(const, 4, axis)), const)
        sym = dequantize_kv(quantize_kv(const, 4, axis, symmetric=True))
        assert torch.equal(sym[1], const[1]) and torch.allclose(sym, const, rtol=1e-6, atol=0)


def test_int8_kv_is_tighter_than_int4():
    x = torch.randn(2, 64, 64, generator=gen(15))
    e8 = rel(dequantize_kv(quantize_kv(x, 8)), x)
    e4 = rel(dequantize_kv(quantize_kv(x, 4)), x)
    assert e8 < 0.01 < e4 < 0.15, (e8, e4)


@pytest.mark.parametrize("bits", [0, 2, 3, 16, "8"])
def test_bad_bits_raise(bits):
    with pytest.raises(LonghaulError, match="bits=4 or bits=8"):
        quantize_kv(torch.randn(4, 8), bits)
    with pytest.raises(LonghaulError, match="bits=4 or bits=8"):
        KVQuant(bits=bits)


def test_bad_groups_and_axis_raise():
    with pytest.raises(LonghaulError, match="must divide head_dim"):
        quantize_kv(torch.randn(4, 10), 8, "token", group=4)
    with pytest.raises(LonghaulError, match="must divide the token count"):
        quantize_kv(torch.randn(6, 8), 8, "channel", group=4)
    with pytest.raises(LonghaulError, match="'token' or 'channel'"):
        quantize_kv(torch.randn(4, 8), 8, "head")
    with pytest.raises(LonghaulError, match="unknown KV cache dtype"):
        kv_preset("fp8")


def test_quantized_prefix_policy():
    # length, residual, group -> tokens held quantized
    cases = [(0, 0, 1, 0), (5, 0, 1, 5), (5, 2, 1, 3), (5, 9, 1, 0), (15, 0, 16, 0), (16, 0, 16, 16),
             (33, 0, 16, 32), (40, 8, 16, 32), (39, 8, 16, 16)]
    for length, r, g, want in cases:
        assert quantized_prefix(length, r, g) == want, (length, r, g)
    lengths = torch.arange(50)
    assert quantized_prefix(lengths, 8, 16).tolist() == [quantized_prefix(n, 8, 16) for n in range(50)]


def test_presets_and_fake_quantization():
    assert set(KV_PRESETS) == {"int8", "int4"}
    assert kv_preset("int4").bits == 4 and kv_preset("int4").k_axis == "channel"
    k, v = torch.randn(2, 16, 64, generator=gen(16)), torch.randn(2, 16, 64, generator=gen(17))
    kf, vf = kv_preset("int8").fake(k, v)
    assert kf.shape == k.shape and rel(kf, k) < 0.01 and rel(vf, v) < 0.01
    kf, vf = kv_preset("int4").fake(k, v, k_group=8)
    assert rel(kf, k) < 0.15 and rel(vf, v) < 0.15
