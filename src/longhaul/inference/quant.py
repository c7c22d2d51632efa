"""Quantization for the inference engine: INT8 weight-only linears and INT8/INT4 KV tensors.

Owns the number formats and the pure tensor functions over them:
- `Int8Linear`: symmetric per-output-channel int8 weights, `w(x) = x @ W.T`; `quantize_weights`
  swaps the projections of a Llama/Qwen2 model (or a state dict) for them;
- `quantize_kv` / `dequantize_kv`: int8 or int4 keys and values with one scale per token (over
  a group of channels) or per channel (over a group of tokens, KIVI-style), `pack_int4` /
  `unpack_int4` for two codes a byte, and `quantized_prefix`, the "recent tokens stay in full
  precision" policy;
- `KVQuant` and `KV_PRESETS`: a cache format by name (`"int8"`, `"int4"`).
Does not own the paged storage (`kv_cache`, `kv_quant`) or the forward (`model_runner`).

Format choices (the paper, KIVI, Liu et al. 2024, uses asymmetric per-channel K and per-token V
with a full-precision residual; deviations noted):
- every KV code is an unsigned byte (or nibble) and dequantizes as `code * scale + bias`, one
  fused multiply-add for both modes: asymmetric sets `bias = min` and spends all 2**bits codes;
  symmetric sets `bias = -2**(bits-1) * scale` and uses codes 1..2**bits-1 (zero exact).
  Asymmetric is the default: post-RoPE keys have channels with a large offset, and at 4 bits
  one code in sixteen matters. Rounding error is at most scale / 2 per element in both modes.
- scales and biases are float32 (at head_dim 64, per-token int8 costs 72 bytes a head-token
  against 128 in bf16; int4 costs 40).
- KIVI quantizes a group only after R newer tokens exist. Here `quantized_prefix` holds the
  newest `residual` tokens plus the unfinished group in full precision; the paged cache uses
  residual 0 and group = block size (the open block of each sequence is its full-precision window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from longhaul.errors import LonghaulError
from longhaul.ops.kernels import native
from longhaul.ops.linear import DequantizedCopy, panel_width, quantized_kernel_rows
from longhaul.ops.pages import on_huge_pages

Axis = Literal["token", "channel"]
_KERNEL_DTYPES = (torch.bfloat16, torch.float16)
_EMPTY = torch.empty(0)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---- INT8 weights -----------------------------------------------------------------------------


def int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in) float -> (codes (out, in) int8 in [-127, 127], scales (out,) float32).

    Symmetric round-to-nearest: |w - codes * scale[:, None]| <= scale / 2 elementwise.
    """
    if w.dim() != 2:
        raise LonghaulError(f"int8 weight quantization needs a 2-D (out, in) weight, got shape {tuple(w.shape)}")
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
    codes = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes, scale


class Int8Linear(nn.Module):
    """A weight-only int8 linear: `y = x @ (codes * scale[:, None]).T (+ bias)`, y in x's dtype.

    On CPU, calls of up to `native_rows` rows (every call, except on an AMX CPU:
    `linear.quantized_kernel_rows`) use the native int8 kernel once `use_native` packed
    the codes (the engine's packer does): it quantizes x per 32 values to int8 (scale max|x| / 127,
    as llama.cpp's Q8_0 dot products do) and sums exact integer products, so its y is that of x
    on this grid (each value within half its group's step). Calls of more rows on CPU (prefill,
    large batches; without the kernel, more than `KERNEL_ROWS`) multiply by the dequantized weight,
    oneDNN-packed once per dtype (`linear.DequantizedCopy`: a float copy beside the codes).
    Otherwise, for few bf16/fp16 rows
    without the kernel, `torch._weight_int8pack_mm` (int8 weights, scales in x's dtype); float32
    inputs without the kernel and other devices multiply by the weight cast to x's dtype and scale
    the output (exact: the scale is per output channel).
    """

    KERNEL_ROWS = 16

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("codes", codes.contiguous())  # (out, in) int8
        self.register_buffer("scale", scale.float().contiguous())  # (out,)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self._native = None  # (kernel, panels) once `use_native` packed the codes
        self.native_rows = 0  # the most rows a call takes through the native kernel
        self._large = None  # DequantizedCopy, made by the first call of more than KERNEL_ROWS rows

    def use_native(self, kernel, nr: int = 0) -> "Int8Linear":
        """Take calls of up to `native_rows` rows through the native integer kernel
        (`csrc/small_gemm_blocks.cpp` with one scale an output: codes in 8- or 16-output panels
        of k quads, AVX512-VNNI or AVX2 integer dot products); a second copy of the codes, in the
        kernel's order, stored as code + 128."""
        u = (self.codes.to(torch.int16) + 128).to(torch.uint8)
        self._native = (kernel, on_huge_pages(kernel.pack_blocks(u, _EMPTY, _EMPTY, 8, 128, nr)[0]))
        self.native_rows = quantized_kernel_rows()
        return self

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        return cls(*int8_per_channel(weight), bias)

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight (out, in) these codes stand for."""
        return (self.codes.float() * self.scale[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a decode-step matmul takes ~25 us: every microsecond of Python here shows, hence the
        # direct _buffers reads and the reshapes skipped for the runner's 2-D inputs
        buf = self._buffers
        codes, scale, bias = buf["codes"], buf["scale"], buf["bias"]
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        native = self._native
        if native is not None and x2.shape[0] <= self.native_rows and x.dtype in (torch.float32, torch.bfloat16):
            y = native[0].mm_blocks(x2, native[1], scale, _EMPTY, 8, 128, codes.shape[0], _EMPTY if bias is None else bias)
            return y if x.dim() == 2 else y.view(*x.shape[:-1], -1)
        if x.is_cpu and x2.shape[0] > self.KERNEL_ROWS:  # prefill, large batches: a GEMM over the float weight
            if self._large is None:
                self._large = DequantizedCopy(self.dequantize, bias)
            y = self._large(x2)
            return y if x.dim() == 2 else y.view(*x.shape[:-1], -1)
        if scale.dtype != x.dtype:
            scale = scale.to(x.dtype)
        if x.is_cpu and x.dtype in _KERNEL_DTYPES and x2.shape[0] <= self.KERNEL_ROWS:
            y = torch._weight_int8pack_mm(x2.contiguous(), codes, scale)
        else:
            y = F.linear(x2, codes.to(x.dtype)) * scale
        if bias is not None:
            y = y + bias.to(x.dtype)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], -1)

    __call__ = forward  # no hooks: nn.Module's dispatch costs as much as the Python above

    def native_description(self):
        """For `DecodeLayers` (`linear.native_description`): the native kernel's tensors, or None."""
        if self._native is None:
            return None
        bias = _EMPTY if self.bias is None else self.bias
        return ("int8", self._native[1], self.scale, _EMPTY, bias, self.out_features, self.in_features, 8, 128), self.native_rows

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_linear(w: torch.Tensor | None, b: torch.Tensor | None = None) -> tuple[Int8Linear | None, torch.Tensor | None]:
    """(Int8Linear for w with b folded in, None): a drop-in for `linear.pack` when the engine
    runs int8 weights, on the native int8 kernel where it builds (`LONGHAUL_GEMM_PANEL` picks its
    panel width as for fp32); None stays None."""
    if w is None:
        return None, b
    lin = Int8Linear.from_float(w, b)
    kernel = native() if w.device.type == "cpu" else None
    return (lin if kernel is None else lin.use_native(kernel, panel_width())), None


def quantize_weights(target, lm_head: bool = False, skip: tuple[str, ...] = ()):
    """Int8 weights for the projections (q/k/v/o/gate/up/down, and lm_head if asked) of a
    Llama/Qwen2 model, in place, or of a state dict.

    - an `nn.Module`: each matching `nn.Linear` is replaced by an `Int8Linear`; returns the model;
    - a dict of HF-named tensors: returns a new dict in which each matching `*.weight` is an
      `Int8Linear` (its bias folded in and dropped from the dict); other entries are shared.
    `skip` lists substrings of names to leave in float (e.g. `("layers.0.",)`).
    """
    names = PROJECTIONS + (("lm_head",) if lm_head else ())

    def wanted(name: str) -> bool:
        return name.rsplit(".", 1)[-1] in names and not any(s in name for s in skip)

    if isinstance(target, nn.Module):
        swaps = [(n, m) for n, m in target.named_modules() if isinstance(m, nn.Linear) and wanted(n)]
        if not swaps:
            raise LonghaulError(f"no linear named {', '.join(names)} found in {type(target).__name__}; is it a Llama/Qwen2 model?")
        for name, mod in swaps:
            parent, _, attr = name.rpartition(".")
            setattr(target.get_submodule(parent) if parent else target, attr, Int8Linear.from_float(mod.weight, mod.bias))
        return target
    out = dict(target)
    for key, w in target.items():
        if key.endswith(".weight") and wanted(key[: -len(".weight")]) and w.dim() == 2:
            bias = out.pop(key[: -len(".weight")] + ".bias", None)
            out[key] = Int8Linear.from_float(w, bias)
    return out


# ---- INT8 / INT4 KV -------------------------------------------------------------------------


def _check_bits(bits: int) -> None:
    if bits not in (4, 8):
        raise LonghaulError(f"KV quantization supports bits=4 or bits=8, got bits={bits!r}")


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """codes (..., D) uint8 in [0, 15], D even -> (..., D/2) uint8: element 2i in the low nibble,
    2i+1 in the high nibble."""
    if codes.shape[-1] % 2:
        raise LonghaulError(f"int4 packing needs an even last dimension, got {codes.shape[-1]}")
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(..., D/2) uint8 -> (..., D) uint8 in [0, 15]; inverse of `pack_int4`."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


@dataclass
class QuantizedKV:
    """Codes and affine parameters of one KV tensor (..., T, D); `x ~= code * scale + bias`.

    codes: (..., T, D) uint8, or (..., T, D/2) packed for 4 bits. scale, bias: float32 of the
    grouped shape, (..., T, D/group, 1) for axis "token", (..., T/group, 1, D) for "channel".
    """

    codes: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor
    bits: int
    axis: Axis
    group: int

    @property
    def shape(self) -> tuple[int, ...]:
        *lead, t, d = self.codes.shape
        return (*lead, t, d * 2 if self.bits == 4 else d)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.bias))


def _grouped(x: torch.Tensor, axis: Axis, group: int | None) -> tuple[torch.Tensor, int, int]:
    """x (..., T, D) viewed so one reduction dim holds each scale's group; (view, dim, group)."""
    *lead, t, d = x.shape
    if axis == "token":  # one scale per token per `group` channels
        g = group or d
        if d % g:
            raise LonghaulError(f"per-token KV group {g} must divide head_dim {d}")
        return x.reshape(*lead, t, d // g, g), -1, g
    if axis == "channel":  # one scale per channel per `group` tokens
        g = group or t
        if t % g:
            raise LonghaulError(f"per-channel KV group {g} must divide the token count {t}; quantize whole groups only")
        return x.reshape(*lead, t // g, g, d), -2, g
    raise LonghaulError(f"KV quantization axis must be 'token' or 'channel', got {axis!r}")


def quantize_kv(x: torch.Tensor, bits: int = 8, axis: Axis = "token", group: int | None = None,
                symmetric: bool = False) -> QuantizedKV:
    """x (..., T, D) float -> `QuantizedKV` with codes in [0, 2**bits).

    axis "token": one (scale, bias) per token for each `group` channels (None: all D);
    axis "channel": one per channel for each `group` consecutive tokens (None: all T).
    Round to nearest: |dequantize_kv(q) - x| <= scale / 2 elementwise (up to float32 rounding).
    """
    _check_bits(bits)
    xg, dim, g = _grouped(x.float(), axis, group)
    qmax = 2**bits - 1
    if symmetric:
        half = 2 ** (bits - 1)
        scale = (xg.abs().amax(dim=dim, keepdim=True) / (half - 1)).clamp_min(1e-12)
        codes = (torch.round(xg / scale).clamp_(1 - half, half - 1) + half)
        bias = -half * scale
    else:
        lo, hi = xg.amin(dim=dim, keepdim=True), xg.amax(dim=dim, keepdim=True)
        scale = ((hi - lo) / qmax).clamp_min(1e-12)
        codes = torch.round((xg - lo) / scale).clamp_(0, qmax)
        bias = lo
    codes = codes.to(torch.uint8).reshape(x.shape)
    return QuantizedKV(pack_int4(codes) if bits == 4 else codes, scale, bias, bits, axis, g)


def dequantize_kv(q: QuantizedKV, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`QuantizedKV` -> (..., T, D) tensor of `dtype`."""
    codes = unpack_int4(q.codes) if q.bits == 4 else q.codes
    cg, _, _ = _grouped(codes, q.axis, q.group)
    return (cg.float() * q.scale + q.bias).reshape(codes.shape).to(dtype)


def quantized_prefix(length: int | torch.Tensor, residual: int = 0, group: int = 1):
    """How many leading tokens of a `length`-token sequence are held quantized: whole groups
    only, and never the newest `residual` tokens (works elementwise on a tensor of lengths)."""
    if isinstance(length, torch.Tensor):
        return (length - residual).clamp_min(0) // group * group
    return max(length - residual, 0) // group * group


@dataclass(frozen=True)
class KVQuant:
    """A KV cache format: bits, where K's and V's scales sit, and the full-precision window."""

    bits: int = 8
    k_axis: Axis = "token"  # "channel": KIVI's per-channel keys (outlier channels get their own scale)
    v_axis: Axis = "token"  # values are mixed per token by attention; per-token error stays local
    k_group: int | None = None  # channel: tokens a scale spans (the cache uses its block size); token: channels
    v_group: int | None = None  # channels per scale for per-token V (None: the whole head)
    symmetric: bool = False  # asymmetric keeps the full code range for offset channels (see module doc)
    residual: int = 0  # newest tokens always in full precision (besides an unfinished group)

    def __post_init__(self):
        _check_bits(self.bits)

    def fake(self, k: torch.Tensor, v: torch.Tensor, k_group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (..., T, D) through quantize + dequantize (T divisible by the channel group)."""
        kq = quantize_kv(k, self.bits, self.k_axis, k_group or self.k_group, self.symmetric)
        vq = quantize_kv(v, self.bits, self.v_axis, self.v_group, self.symmetric)
        return dequantize_kv(kq, k.dtype), dequantize_kv(vq, v.dtype)


# Cache formats by name (`kv_cache_dtype`), chosen on SmolLM2-135M (benchmarks/quant_quality.py,
# KL to fp32 per token): int8 per token is already near lossless (KL 0.0001); at int4, per-channel
# keys over a 16-token block give a third of the KL of per-token keys in 32-channel groups (0.006
# vs 0.019) for 16 more bytes a head-token, and 32-channel V groups beat whole-head ones.
KV_PRESETS: dict[str, KVQuant] = {
    "int8": KVQuant(bits=8, k_axis="token", v_axis="token"),
    "int4": KVQuant(bits=4, k_axis="channel", v_axis="token", v_group=32),
}


def kv_preset(name: str) -> KVQuant:
    if name not in KV_PRESETS:
        raise LonghaulError(f"unknown KV cache dtype {name!r}; choose one of {', '.join(KV_PRESETS)}")
    return KV_PRESETS[name]
