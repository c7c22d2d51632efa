"""Causal attention over the packed batch's padded attention rows, a tile of queries at a time,
with a backward that recomputes the probabilities: memory linear in the sequence length.

Owns `tiled_attention(q, k, v, q_len, kv_len, g)`, when the packed forward uses it
(`worth_tiling`) and the choice itself (`packed_sdpa`), which hands rows whose every key is also
a query (SFT rows, unshared GRPO rows: plain causal attention) to SDPA's causal kernel instead. Does not own the layout
(`packed_forward.PackedBatch`: row r holds q_len[r] queries, the last ones of its kv_len[r] keys,
query j at key position kv_len - q_len + j) or the block arithmetic shared with context
parallelism (`context_parallel.blocks`).

Why: SDPA over the packed rows needs their dense (R, 1, G Tq, Lk) mask, quadratic in the row
length: 0.4 GB fp32 for two 4,096-token rows, 48 GB for one of 65,536 tokens. Past
`DENSE_ELEMENTS` mask elements (a single row of ~6,700 tokens for SmolLM2's G = 3), a tile of
`TILE` queries attends to the keys its last real query can see (causality skips the rest: about
half the score flops of the dense mask), the softmax is exact over that span (one pass, no
online merge needed), and only q, k, v, the output and the log-sum-exp are kept: the backward
recomputes each tile's probabilities from the log-sum-exp, as FlashAttention does. Below the
threshold SDPA stays: its fused CPU kernel is as fast or faster there (docs/results/training.md).
Where every row is a whole causal sequence (q_len == kv_len), no mask is needed at all and SDPA's
`is_causal` kernel (FlashAttention's blocking on CPU, its memory linear in the row too) does the
tiles' work with fewer passes; the tiles remain for rows whose queries are only their last keys
(a prompt shared by several completions).

Numerics: matmuls in the inputs' dtype (under autocast, q, k and v in the autocast dtype, the
function itself run outside autocast so that the backward recomputes exactly the forward's
scores), softmax, log-sum-exp and the gradients' accumulation in fp32. fp32 equals SDPA with the
packed mask to rounding (tests: 1e-5 on outputs and gradients); bf16 within bf16 rounding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from longhaul.ops.autocast import autocast_dtype, no_autocast

TILE = 256  # queries a tile: G * 256 * 4,096 fp32 scores a K/V head, ~12 MB for SmolLM2 at 4k
DENSE_ELEMENTS = 1 << 27  # a dense mask above this many elements (512 MB fp32; SDPA reads it every layer) is tiled


def worth_tiling(R: int, gtq: int, lk: int) -> bool:
    """True when the dense mask of R attention rows of gtq (G * Tq) queries over lk keys, and
    SDPA's scores, would be large enough that the tiles' recompute costs less than the memory."""
    return R * gtq * lk > DENSE_ELEMENTS


def packed_sdpa(qp, kp, vp, q_len: torch.Tensor, kv_len: torch.Tensor, g: int, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention over the packed rows: SDPA with the dense mask, or with none (the caller found the
    rows long: `worth_tiling`) SDPA's causal kernel over whole sequences, else a tile at a time.
    Shapes as `tiled_attention`."""
    if mask is not None:
        return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
    if torch.equal(q_len, kv_len):
        return causal_rows(qp, kp, vp, g)
    return tiled_attention(qp, kp, vp, q_len, kv_len, g)


def _attention_dtype(q: torch.Tensor, v: torch.Tensor) -> torch.dtype:
    """Under autocast its dtype (RoPE hands over fp32 q, k beside a bf16 v), else the inputs'."""
    return autocast_dtype(q.device) or torch.promote_types(q.dtype, v.dtype)


def causal_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: int) -> torch.Tensor:
    """`tiled_attention` where every row's queries are all its keys (q_len == kv_len, so Tq == Lk):
    query j sees keys 0 .. j, which is SDPA's `is_causal`. A shorter row's pad queries come after
    its real ones and see only its pad keys besides them; their outputs are never used."""
    R, hkv, gtq, d = q.shape
    dt = _attention_dtype(q, v)
    q, k, v = (t.to(dt) for t in (q, k, v))
    with no_autocast(q.device):  # its inputs already in the dtype it attends in
        out = F.scaled_dot_product_attention(q.reshape(R, hkv * g, gtq // g, d), k.repeat_interleave(g, 1),
                                             v.repeat_interleave(g, 1), is_causal=True)
    return out.view(R, hkv, gtq, d)


def query_positions(q_len: torch.Tensor, kv_len: torch.Tensor, tq: int) -> torch.Tensor:
    """(R,), (R,) -> (R, Tq) key position of each query; a pad query (j >= q_len) sits past the
    row's keys and sees them all (its output and gradient are never used)."""
    return (kv_len - q_len)[:, None] + torch.arange(tq, device=q_len.device)[None, :]


def _tiles(qpos: torch.Tensor, kv_len: torch.Tensor, lk: int):
    """(start, end, key span, mask (R, 1, 1, t, span)) for each tile of queries: the span ends
    after the last key any row's tile query can see (a pad query counts as its row's last)."""
    keys = torch.arange(lk, device=qpos.device)
    for a in range(0, qpos.shape[1], TILE):
        e = min(a + TILE, qpos.shape[1])
        span = int(min(lk, torch.minimum(qpos[:, e - 1], kv_len - 1).max().item() + 1))
        k = keys[:span]
        ok = (k[None, None, :] <= qpos[:, a:e, None]) & (k[None, None, :] < kv_len[:, None, None])
        yield a, e, span, ok[:, None, None]


def _probs(q, k, ok, lse, scale: float) -> torch.Tensor:
    """q (R, Hkv, G, t, D), k (R, Hkv, S, D) -> fp32 scaled, masked scores (R, Hkv, G, t, S);
    given lse (R, Hkv, G, t), the probabilities exp(scores - lse) instead (in place)."""
    R, hkv, g, t, d = q.shape
    s = (q.reshape(R, hkv, g * t, d) @ k.transpose(-1, -2)).view(R, hkv, g, t, -1).float()
    s.mul_(scale).masked_fill_(~ok, float("-inf"))
    if lse is not None:
        s.sub_(lse[..., None]).exp_()
    return s


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_len, kv_len, scale: float):
        R, hkv, g, tq, d = q.shape
        qpos = query_positions(q_len, kv_len, tq)
        out = torch.empty_like(q)
        lse = torch.empty((R, hkv, g, tq), dtype=torch.float32, device=q.device)
        for a, e, span, ok in _tiles(qpos, kv_len, k.shape[2]):
            s = _probs(q[..., a:e, :], k[:, :, :span], ok, None, scale)
            m = torch.logsumexp(s, dim=-1)  # finite: every query sees key 0
            lse[..., a:e] = m
            p = s.sub_(m[..., None]).exp_().view(R, hkv, g * (e - a), span)
            out[..., a:e, :] = (p.to(v.dtype) @ v[:, :, :span]).view(R, hkv, g, e - a, d)
        ctx.save_for_backward(q, k, v, out, lse, q_len, kv_len)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, q_len, kv_len = ctx.saved_tensors
        R, hkv, g, tq, d = q.shape
        scale = ctx.scale
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1)  # (R, Hkv, G, Tq): the softmax backward's row term
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for a, e, span, ok in _tiles(query_positions(q_len, kv_len, tq), kv_len, k.shape[2]):
            t = e - a
            qt, kt, vt = q[..., a:e, :], k[:, :, :span], v[:, :, :span]
            p = _probs(qt, kt, ok, lse[..., a:e], scale).view(R, hkv, g * t, span)
            do = dout[..., a:e, :].reshape(R, hkv, g * t, d)
            dv[:, :, :span] += (p.to(v.dtype).transpose(-1, -2) @ do.to(v.dtype)).float()
            dp = (do.to(v.dtype) @ vt.transpose(-1, -2)).float().view(R, hkv, g, t, span)
            ds = p.view(dp.shape).mul_(dp.sub_(delta[..., a:e, None])).mul_(scale)  # d loss / d raw scores, in p's buffer
            ds = ds.view(R, hkv, g * t, span).to(q.dtype)
            dq[..., a:e, :] = (ds @ kt).view(R, hkv, g, t, d)
            dk[:, :, :span] += (ds.transpose(-1, -2) @ qt.reshape(R, hkv, g * t, d)).float()
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_len: torch.Tensor, kv_len: torch.Tensor,
                    g: int, scale: float | None = None) -> torch.Tensor:
    """q (R, Hkv, G * Tq, D), the G query heads of a K/V head folded into the query length
    (G blocks of Tq), k, v (R, Hkv, Lk, D), q_len, kv_len (R,) -> (R, Hkv, G * Tq, D): SDPA with
    the packed rows' causal mask (`packed_forward._layout`), on the real queries."""
    R, hkv, gtq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    dt = _attention_dtype(q, v)
    q, k, v = (t.to(dt) for t in (q, k, v))
    with no_autocast(q.device):
        out = _TiledAttention.apply(q.reshape(R, hkv, g, gtq // g, d), k, v, q_len.to(q.device), kv_len.to(q.device), scale)
    return out.view(R, hkv, gtq, d)
