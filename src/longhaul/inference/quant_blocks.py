"""Block-quantized weights in llama.cpp's GGUF formats, for the engine's linears.

Owns the three formats (groups of 32 weights along a row's inputs, fp16 scales), their
quantization from float weights (llama.cpp's reference rounding, so a weight quantized here
equals what `llama-quantize` makes of the same fp32 weight), their decoding from GGUF block
bytes (no detour through float weights), dequantization, and `BlockLinear`, the callable linear
the engine's runner uses. Does not own reading a GGUF file (`gguf_weights`) or the kernel
(`ops/csrc/small_gemm_blocks.cpp`).

  Q8_0: w = d * c, c in [-127, 127]                    34 bytes a block (8.5 bits a weight)
  Q4_0: w = d * (c - 8), c in [0, 15]                  18 bytes (4.5 bits)
  Q4_1: w = d * c + m, c in [0, 15]                    20 bytes (5 bits)

Codes are held unpacked, one byte a weight, as the unsigned u the kernel reads (w = d * (u -
offset) (+ m): Q8_0 stores c + 128), with d and m as (N, K / 32) fp16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from longhaul.errors import LonghaulError
from longhaul.ops.kernels import native
from longhaul.ops.linear import DequantizedCopy, panel_width, quantized_kernel_rows
from longhaul.ops.pages import on_huge_pages

GROUP = 32
_EMPTY = torch.empty(0)


@dataclass(frozen=True)
class Format:
    name: str
    bits: int
    offset: int  # w = d * (u - offset) (+ m)
    with_min: bool
    block_bytes: int  # in a GGUF file


FORMATS = {f.name: f for f in (Format("q8_0", 8, 128, False, 34), Format("q4_0", 4, 8, False, 18),
                               Format("q4_1", 4, 0, True, 20))}


def fmt(name: str) -> Format:
    if name not in FORMATS:
        raise LonghaulError(f"unknown block format {name!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[name]


def _groups(w: torch.Tensor) -> torch.Tensor:
    """w (N, K) -> fp32 (N, K / 32, 32); K must be a multiple of 32, as in GGUF."""
    n, k = w.shape
    if k % GROUP:
        raise LonghaulError(f"block formats need a row length divisible by {GROUP}, got {k}; keep this weight unquantized")
    return w.detach().float().reshape(n, k // GROUP, GROUP)


def quantize(w: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """w (N, K) float -> (u (N, K) uint8, d (N, K/32) fp16, m or None), llama.cpp's reference
    rounding: Q8_0 round(w / d) with d = max|w| / 127; Q4_0 d = (the value of largest magnitude) /
    -8, c = min(15, trunc(w / d + 8.5)); Q4_1 d = (max - min) / 15, m = min, c = min(15,
    trunc((w - m) / d + 0.5)). The codes use the unrounded d; the stored d is rounded to fp16."""
    f = fmt(name)
    g = _groups(w)
    m = None
    if f.name == "q8_0":
        d = g.abs().amax(-1) / 127
        inv = torch.where(d > 0, 1 / d, torch.zeros(()))
        x = g * inv[..., None]
        u = (x.sign() * (x.abs() + 0.5).floor()).clamp(-127, 127) + 128  # roundf: halves away from zero
    elif f.name == "q4_0":
        idx = g.abs().argmax(-1, keepdim=True)
        d = g.gather(-1, idx).squeeze(-1) / -8
        inv = torch.where(d != 0, 1 / d, torch.zeros(()))
        u = (g * inv[..., None] + 8.5).trunc().clamp(0, 15)
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        d = (hi - lo) / 15
        inv = torch.where(d != 0, 1 / d, torch.zeros(()))
        u = ((g - lo[..., None]) * inv[..., None] + 0.5).trunc().clamp(0, 15)
        m = lo.half()
    return u.to(torch.uint8).reshape(w.shape), d.half(), m


def decode(raw: np.ndarray, name: str, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """GGUF block bytes of an (n, k) tensor (n * k / 32 blocks, row-major) -> (u, d, m) as
    `quantize` returns them. In a 4-bit block, byte j's low nibble is value j, its high nibble
    value j + 16."""
    f = fmt(name)
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n * (k // GROUP), f.block_bytes)
    d = blocks[:, :2].copy().view(np.float16)
    m = blocks[:, 2:4].copy().view(np.float16) if f.with_min else None
    qs = blocks[:, 4 if f.with_min else 2:]
    if f.bits == 8:
        u = (qs.view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    else:
        u = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    as_t = lambda a, shape: torch.from_numpy(np.ascontiguousarray(a)).reshape(shape)  # noqa: E731
    return (as_t(u, (n, k)), as_t(d, (n, k // GROUP)), None if m is None else as_t(m, (n, k // GROUP)))


def dequantize(u: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, name: str, dtype=torch.float32) -> torch.Tensor:
    f = fmt(name)
    n, k = u.shape
    w = (u.float().reshape(n, k // GROUP, GROUP) - f.offset) * d.float()[..., None]
    if m is not None:
        w = w + m.float()[..., None]
    return w.reshape(n, k).to(dtype)


class BlockLinear:
    """A block-quantized weight (N, K) as a linear: `w(x) = x @ W.T (+ bias)`, y in x's dtype.

    Calls of up to `native_rows` rows (every call, except on an AMX CPU:
    `linear.quantized_kernel_rows`) run the native kernel (activations quantized per 32 values,
    integer dot products); larger calls multiply by the dequantized weight, kept oneDNN-packed in
    `dtype` once first needed (a second copy: the prefill speed of a plain linear). Without the
    native kernels every call takes the dequantized path.
    """

    def __init__(self, u: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, name: str,
                 bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32, nr: int | None = None):
        self.format = fmt(name)
        self.u, self.d, self.m = u.contiguous(), d.contiguous(), None if m is None else m.contiguous()
        self.out_features, self.in_features = u.shape
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.dtype = dtype
        self._large = DequantizedCopy(self.dequantize, self.bias)
        self._kernel = native()
        self._packed = None
        self.native_rows = quantized_kernel_rows() if self._kernel is not None else 0
        if self._kernel is not None:
            width = panel_width() if nr is None else nr
            packed = self._kernel.pack_blocks(self.u, self.d, _EMPTY if m is None else self.m, self.format.bits,
                                              self.format.offset, width)
            self._packed = [on_huge_pages(t) for t in packed]

    @classmethod
    def from_float(cls, w: torch.Tensor, name: str, bias: torch.Tensor | None = None, dtype=torch.float32, nr=None):
        return cls(*quantize(w, name), name, bias, dtype, nr)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.u, self.d, self.m, self.format.name, dtype)

    def weight_bytes(self) -> int:
        """Bytes a decode step streams: the codes at their width and the fp16 scales."""
        n, k = self.u.shape
        return n * k * self.format.bits // 8 + self.d.numel() * 2 * (2 if self.m is not None else 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if self._packed is not None and x2.shape[0] <= self.native_rows and x.dtype in (torch.float32, torch.bfloat16):
            codes, d, m = self._packed
            y = self._kernel.mm_blocks(x2, codes, d, m, self.format.bits, self.format.offset, self.out_features,
                                       _EMPTY if self.bias is None else self.bias)
        else:
            y = self._large(x2)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], -1)

    def native_description(self):
        """For `DecodeLayers` (`linear.native_description`): the native kernel's tensors, or None."""
        if self._packed is None:
            return None
        codes, d, m = self._packed
        bias = _EMPTY if self.bias is None else self.bias
        return ((self.format.name, codes, d, m, bias, self.out_features, self.in_features, self.format.bits, self.format.offset),
                self.native_rows)


def concat(parts: list[BlockLinear], bias: torch.Tensor | None = None) -> BlockLinear:
    """Row-wise concatenation of block weights of one format (the runner's fused q/k/v and gate/up)."""
    name = parts[0].format.name
    if any(p.format.name != name for p in parts):
        raise LonghaulError(f"cannot fuse weights of formats {sorted({p.format.name for p in parts})}; quantize them alike")
    ms = [p.m for p in parts]
    m = None if ms[0] is None else torch.cat(ms)
    return BlockLinear(torch.cat([p.u for p in parts]), torch.cat([p.d for p in parts]), m, name, bias, parts[0].dtype)
