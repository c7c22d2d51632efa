"""Linear layers of the model runner: one dispatch for every projection, and prepacked weights.

Owns `linear(x, w, b)`, the single way the runner applies a weight: a plain tensor goes
through `F.linear`, anything callable (`PackedLinear` here, the INT8 weight-only linears of
`quant.py`) is called as `w(x) = x @ W.T`. Does not own quantization.

`PackedLinear` keeps a weight in oneDNN's blocked layout (the reorder inductor does when it
freezes a CPU graph), so each call skips the per-call repacking of `F.linear`. bf16/fp16: on a
Sapphire Rapids core this halves the time of the decode matmuls (AMX at batch 32, a tighter
GEMV at batch 1); results equal `F.linear` to bf16 rounding. fp32 (oneDNN's packed sgemm, not
MKL's, which pays only at the batch size it was packed for): on a 2-core AVX2 EPYC the 576 x
49,152 head takes 10 ms instead of 28 at batch 8 (17 vs 39 at 32) and the decoder's linears
~1.8x less at batch 8, about equal from 128 rows; results equal `F.linear` to fp32 rounding
(summation order: ~4e-6 relative at K = 576).

`SmallBatchLinear` (fp32 on an AVX2 + FMA CPU, where `kernels.native` builds) replaces the
oneDNN path for fp32: weights packed in 8-output panels (16 with AVX-512) streamed once per 8 rows. Measured on
the 2-core AVX2 EPYC, all of SmolLM2-135M's linears (538 MB): 33 vs 57 ms at batch 1, 36 vs 64
at batch 8, 55 vs 88 at 16, equal at 32-44, 12% slower from 64 rows (prefill chunks). Results
are plain fp32 FMA sums in k order (~1e-6 relative to fp64 at K = 1,536).

`SmallBatchLinearBF16` does the same for bf16 weights (`csrc/small_gemm_bf16.cpp`): k-pair panels
for AVX512-BF16 dot products (`dp`) where the CPU has them, else 8-wide panels widened to fp32 on
AVX2 (`widen`); calls of more rows than `bf16_kernel_rows` go to a oneDNN-packed copy (AMX or
AVX512-BF16 GEMM), so prefill keeps oneDNN's speed. Results: fp32 sums of the bf16 products,
rounded to bf16 once.

`LONGHAUL_GEMM_PANEL=8` (read by `pack`, so set it before the engine packs its weights) makes an
AVX-512 CPU use the 8-output AVX2 panels, fp32 and bf16, the paths an AVX2-only CPU takes (the
tests run both on one host this way); `16` asks for the AVX-512 panels (and the AVX512-BF16 ones
for bf16) and fails where the CPU lacks them; unset, `pack` takes the widest this CPU runs. bf16 weights pack only where
oneDNN has a bf16 path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT); on an AVX2-only CPU `pack` keeps
the plain weight for `F.linear`.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from longhaul.ops.kernels import native
from longhaul.ops.pages import on_huge_pages


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (N, K) @ w.T (+ b) -> (N, M) for a weight tensor (M, K) or a callable weight; with
    `out` (a contiguous (N, M) tensor, e.g. rows of a recording buffer) the result is written
    there and `out` returned (straight from the native kernel, else by a copy)."""
    if out is not None and b is None and isinstance(w, SmallBatchLinear):
        return w(x, out=out)
    if callable(w):
        y = w(x)
        y = y if b is None else y + b
    else:
        y = F.linear(x, w, b)
    return y if out is None else out.copy_(y)


def _packable(w: torch.Tensor) -> bool:
    return (w.device.type == "cpu" and w.dtype in (torch.bfloat16, torch.float16, torch.float32) and w.dim() == 2
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear:
    """A weight (M, K) prepacked for oneDNN; call it on x (N, K) -> (N, M).

    Keeps no reference to the plain weight; `pack` it again after the weight changes.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


class SmallBatchLinear:
    """An fp32 weight (M, K) in the native kernel's panels (16 outputs wide where the CPU has
    AVX-512, else 8; `nr` forces one); call it on x (N, K) -> (N, M).

    Keeps no reference to the plain weight; `pack` it again after the weight changes.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel, nr: int = 0):
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self._kernel = kernel
        self.weight = on_huge_pages(kernel.pack(weight, nr))
        padded = self.weight.shape[0] * self.weight.shape[2]
        self.bias = torch.empty(0) if bias is None else F.pad(bias.detach().float(), (0, padded - self.out_features)).contiguous()

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is not None:  # (N, M) contiguous: the kernel writes there
            return self._kernel.mm_into(x.reshape(-1, self.in_features), self.weight, self.out_features, self.bias, out)
        y = self._kernel.mm(x.reshape(-1, self.in_features), self.weight, self.out_features, self.bias)
        return y.view(*x.shape[:-1], self.out_features)


class SmallBatchLinearBF16:
    """A bf16 weight (M, K) in the native kernel's bf16 panels (`csrc/small_gemm_bf16.cpp`: k-pair
    panels for AVX512-BF16 dot products, else 8-wide panels widened to fp32 on AVX2), for calls of
    up to `rows` rows (`bf16_kernel_rows`); larger calls (prefill chunks) go to a oneDNN-prepacked
    copy, which uses AMX or AVX512-BF16 GEMM and reads each weight once for many rows. Both copies
    are kept: twice the weight memory of a plain bf16 linear. Output bf16, rounded once from fp32
    sums.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel, kind: str = ""):
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self._kernel = kernel
        self.weight = on_huge_pages(kernel.pack_bf16(weight, kind))
        self.rows = bf16_kernel_rows(self.weight.dim() == 4)
        self.bias = torch.empty(0) if bias is None else bias.detach().contiguous()
        try:
            self.large = PackedLinear(weight, bias)
        except RuntimeError:  # a build without the oneDNN linear ops: the kernel takes every call
            self.large = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > self.rows and self.large is not None:
            return self.large(x)
        y = self._kernel.mm_bf16(rows, self.weight, self.out_features, self.bias)
        return y.view(*x.shape[:-1], self.out_features)


def bf16_kernel_rows(dp: bool) -> int:
    """The most rows a call of the native bf16 kernel takes before oneDNN's copy does: 48 for the
    AVX512-BF16 panels (`dp`) on a CPU without AMX, where the kernel's dot products beat oneDNN's
    AVX512-BF16 GEMM up to about that many rows, so a decode step of 32 sequences stays in one
    native call; 16 with AMX (oneDNN's tile GEMM) or on the AVX2 `widen` panels."""
    return 48 if dp and not amx() else 16


def bf16_kind() -> str:
    """The bf16 packing `pack` asks for: `LONGHAUL_GEMM_PANEL` 8 forces the AVX2 path (`widen`), 16
    the AVX512-BF16 one (`dp`); unset, the best this CPU runs."""
    return {0: "", 8: "widen", 16: "dp"}[panel_width()]


def panel_width() -> int:
    """The small-batch GEMM panel width `pack` asks for: `LONGHAUL_GEMM_PANEL` (8 or 16), else 0
    (the widest this CPU runs)."""
    forced = os.environ.get("LONGHAUL_GEMM_PANEL", "")
    if forced not in ("", "8", "16"):
        raise ValueError(f"LONGHAUL_GEMM_PANEL must be 8 or 16 (or unset), not {forced!r}")
    return int(forced or 0)


def amx() -> bool:
    """Whether this CPU has AMX tiles (oneDNN's bf16/int8 GEMMs run on them)."""
    probe = getattr(getattr(torch, "cpu", None), "_is_amx_tile_supported", None)
    return bool(probe is not None and probe())


def quantized_kernel_rows() -> int:
    """The most rows a call of the native integer kernels (int8, Q8_0, Q4_0, Q4_1) takes; larger
    calls multiply by a dequantized oneDNN copy (`DequantizedCopy`). 16 on a CPU with AMX, whose
    tile GEMM over the copy is the faster prefill there; elsewhere every call, since oneDNN's
    AVX-512 or AVX2 GEMM over a float copy is slower than the integer dot products from a few
    rows up (docs/results/inference.md)."""
    return 16 if amx() else 1 << 30


def pack(w: torch.Tensor | None, b: torch.Tensor | None = None, few_rows: bool = True):
    """The fastest callable for weight w (and bias b), or w itself when nothing faster exists.

    few_rows: the weight mostly sees calls of a few rows (decode steps); False for forwards of
    hundreds of rows (a reference model), where oneDNN's fp32 path is faster than the native
    kernel. Returns (weight-or-callable, bias-left-to-add): a packed linear absorbs its bias.
    """
    if w is None or not isinstance(w, torch.Tensor) or not _packable(w):
        return w, b
    if few_rows and w.dtype == torch.float32 and (b is None or b.dtype == torch.float32):
        kernel = native()
        if kernel is not None:
            return SmallBatchLinear(w, b, kernel, panel_width()), None
    if few_rows and w.dtype == torch.bfloat16:
        kernel = native()
        if kernel is not None:
            kind = bf16_kind() or ("dp" if kernel.has_avx512_bf16() and w.shape[1] % 2 == 0 else "widen")
            if kind == "widen" or w.shape[1] % 2 == 0:  # dp reads k in pairs
                return SmallBatchLinearBF16(w, b, kernel, kind), None
    try:
        return PackedLinear(w, b), None
    except RuntimeError:  # a build without the oneDNN linear ops
        return w, b


def native_description(w, b=None):
    """What `DecodeLayers` (csrc/decode_step.cpp) needs to call weight w's kernel itself, or None
    when w has no native kernel: (kind, weight, a, b, bias, out features, in features, bits, offset), and the
    most rows it takes there (beyond them the callable sends rows elsewhere, e.g. to oneDNN)."""
    empty = torch.empty(0)
    if b is not None:  # a bias the packer left to the caller
        return None
    if isinstance(w, SmallBatchLinear):
        return ("fp32", w.weight, empty, empty, w.bias, w.out_features, w.in_features, 0, 0), 1 << 30
    if isinstance(w, SmallBatchLinearBF16):
        return ("bf16", w.weight, empty, empty, w.bias, w.out_features, w.in_features, 0, 0), \
            w.rows if w.large is not None else 1 << 30
    describe = getattr(w, "native_description", None)  # the quantized linears describe themselves
    return describe() if describe is not None else None


def native_layers(layers) -> tuple[list, int] | None:
    """The runner's packed layers (ln1, qkv, qkv_b, o, o_b, ln2, gate_up, gate_up_b, down, down_b)
    described for `DecodeLayers`, and the most rows every linear takes natively; None when any
    projection has no native kernel."""
    out, rows = [], 1 << 30
    for ln1, qkv, qkv_b, o, o_b, ln2, gu, gu_b, down, down_b in layers:
        linears = [native_description(w, b) for w, b in ((qkv, qkv_b), (o, o_b), (gu, gu_b), (down, down_b))]
        if any(d is None for d in linears):
            return None
        rows = min([rows] + [r for _, r in linears])
        (dq, _), (do, _), (dg, _), (dd, _) = linears
        out.append((ln1, dq, do, ln2, dg, dd))
    return out, rows


class DequantizedCopy:
    """A quantized linear's weight dequantized once (per input dtype) and oneDNN-packed, for calls
    of many rows (prefill chunks, large decode batches), where a plain GEMM over the float weight
    beats the integer kernels. `dequantize(dtype)` gives the float weight; bias is fp32 or None.
    Costs a float copy of the weight beside the codes, made on first use."""

    def __init__(self, dequantize, bias: torch.Tensor | None):
        self._dequantize, self._bias, self._by_dtype = dequantize, bias, {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        fn = self._by_dtype.get(x.dtype)
        if fn is None:
            w = self._dequantize(x.dtype)
            b = None if self._bias is None else self._bias.to(x.dtype)
            try:
                fn = PackedLinear(w, b)
            except RuntimeError:  # no oneDNN linear ops in this build
                fn = lambda t, w=w, b=b: F.linear(t, w, b)  # noqa: E731
            self._by_dtype[x.dtype] = fn
        return fn(x)
