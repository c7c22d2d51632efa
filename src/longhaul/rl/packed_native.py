"""The packed training forward's layers through the native CPU kernels (`ops.kernels`,
`csrc/train_ops.cpp`), as autograd functions: RMSNorm, SwiGLU, and the move of q, k, v into
SDPA's padded attention rows with RoPE on the way (and of its output back to the flat rows).

In fp32 on a CPU each is one native pass each way instead of a chain of torch ops, and the
gradients of a fused projection (qkv, gate_up) are written into one buffer instead of cat
together from its parts. Numerics: equal to the torch ops of `packed_forward` to rounding.

Owns the kernels' autograd wrappers and when they can run (`kernels_for`). Does not own the
layout (`packed_forward.PackedBatch`, the `b` each function takes; not imported here, since
`packed_forward` imports this module) or the decoder loop (`packed_forward.hidden_states`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longhaul.ops.autocast import autocast_dtype
from longhaul.ops.kernels import native
from longhaul.rl.tiled_attention import packed_sdpa


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _NativeAttentionPack(torch.autograd.Function):
    """q, k, v flat rows -> SDPA's padded attention rows (`_attention`'s qp, kp, vp), RoPE on q
    and k, in one native pass (`csrc/train_ops.cpp`); the backward writes one gradient per
    input. Given one fused qkv (N, (Hq + 2 Hkv) D) (the recorded projection) instead of three
    tensors, its gradient is one (N, (Hq + 2 Hkv) D) tensor too: no cat of the parts."""

    @staticmethod
    def forward(ctx, qkv, k, v, cos, sin, b, hq: int, hkv: int, native):
        n = qkv.shape[0]
        d = cos.shape[1]
        q = qkv if k is not None else qkv[:, :hq * d]
        views = (q.view(n, hq, d), (k if k is not None else qkv[:, hq * d:(hq + hkv) * d]).view(n, hkv, d),
                 (v if v is not None else qkv[:, (hq + hkv) * d:]).view(n, hkv, d))
        ctx.save_for_backward(cos, sin)
        ctx.fused, ctx.b, ctx.shape, ctx.native = k is None, b, (n, hq, hkv, d), native
        return tuple(native.attention_pack(*views, cos, sin, b.q_index, b.q_len, b.kv_index, b.kv_len))

    @staticmethod
    def backward(ctx, dqp, dkp, dvp):
        cos, sin = ctx.saved_tensors
        n, hq, hkv, d = ctx.shape
        b = ctx.b
        whole = torch.empty((n, (hq + 2 * hkv) * d), dtype=cos.dtype)  # the parts' gradients are its column views
        grads = [whole[:, :hq * d], whole[:, hq * d:(hq + hkv) * d], whole[:, (hq + hkv) * d:]]
        dq, dk, dv = (gr.view(n, h, d) for gr, h in zip(grads, (hq, hkv, hkv)))
        ctx.native.attention_pack_backward(_unit_last(dqp), _unit_last(dkp), _unit_last(dvp), cos, sin, b.out_index,
                                           b.kv_index, b.kv_len, dq, dk, dv)
        return (*((whole, None, None) if ctx.fused else grads), None, None, None, None, None, None)


class _NativeAttentionUnpack(torch.autograd.Function):
    """SDPA's padded output (R, Hkv, G Tq, D) -> the flat rows (N, Hq D) (`_attention`'s last
    two steps) in one native pass each way."""

    @staticmethod
    def forward(ctx, o, b, hq: int, native):
        ctx.b, ctx.shape, ctx.native = b, (o.shape[0], o.shape[1], o.shape[2] // (hq // o.shape[1]), hq), native
        return native.attention_unpack(_unit_last(o), b.out_index, hq)

    @staticmethod
    def backward(ctx, g):
        R, hkv, tq, hq = ctx.shape
        return ctx.native.attention_unpack_backward(_unit_last(g), ctx.b.out_index, R, tq, hkv, hq), None, None, None


def native_attention(qkv, b, cos, sin, hq: int, hkv: int, mask: torch.Tensor, native) -> torch.Tensor:
    """`_attention` after RoPE, through the native layout kernels: qkv is the fused (N, width)
    projection or its (q, k, v) parts."""
    parts = (qkv[0], None, None) if len(qkv) == 1 else qkv
    qp, kp, vp = _NativeAttentionPack.apply(*parts, cos, sin, b, hq, hkv, native)
    o = packed_sdpa(qp, kp, vp, b.q_len, b.kv_len, hq // hkv, mask)
    return _NativeAttentionUnpack.apply(o, b, hq, native)


class NativeSwiGLU(torch.autograd.Function):
    """silu(gate) * up in one native pass each way. Given the fused gate_up (N, 2F) (the
    recorded projection) instead of two tensors, its gradient is one (N, 2F) tensor: no cat."""

    @staticmethod
    def forward(ctx, gate, up, native):
        ctx.fused, ctx.native = up is None, native
        if up is None:
            ctx.save_for_backward(gate)
            f = gate.shape[1] // 2
            gate, up = gate[:, :f], gate[:, f:]
        else:
            ctx.save_for_backward(gate, up)
        return native.swiglu(gate, up)

    @staticmethod
    def backward(ctx, g):
        g = _unit_last(g)
        if ctx.fused:
            (gu,) = ctx.saved_tensors
            f = gu.shape[1] // 2
            dgu = torch.empty_like(gu)
            ctx.native.swiglu_backward(g, gu[:, :f], gu[:, f:], dgu[:, :f], dgu[:, f:])
            return dgu, None, None
        gate, up = ctx.saved_tensors
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
        ctx.native.swiglu_backward(g, gate, up, dgate, dup)
        return dgate, dup, None

class _NativeRMSNorm(torch.autograd.Function):
    """F.rms_norm in fp32 on CPU through the native kernels (`kernels.native`): one pass
    forward, one backward, instead of autograd's chain of pow / mean / rsqrt / mul ops."""

    @staticmethod
    def forward(ctx, x, weight, eps: float, native):
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.native = eps, native
        return native.rms_norm(x, weight, eps)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        dx, dw = ctx.native.rms_norm_backward(g, x, weight, ctx.eps)
        return dx, dw, None, None


def kernels_for(x: torch.Tensor):
    """The native kernels when they can run on x (fp32 on CPU, no autocast), else None."""
    return native() if x.dtype == torch.float32 and x.device.type == "cpu" and autocast_dtype() is None else None


def rms_norm(x: torch.Tensor, norm, kernels=None) -> torch.Tensor:
    """HF's RMSNorm module `norm` on rows x (N, E)."""
    if kernels is None or norm.weight.dtype != torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return _NativeRMSNorm.apply(x, norm.weight, norm.variance_epsilon, kernels)
