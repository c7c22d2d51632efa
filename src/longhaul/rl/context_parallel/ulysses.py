"""Ulysses attention (DeepSpeed-Ulysses, Jacobs et al. 2023): trade the sequence split for a head
split, attend locally, trade back.

Each of N ranks holds a zigzag shard of every head (`zigzag`). One all-to-all gives each rank all
T tokens of Hq / N query heads (and their K/V heads); it runs whole-row causal attention
(`blocks.LocalAttention`, packed-aware) and a second all-to-all returns its output, and the
log-sum-exp, to the sequence split. The all-to-alls are autograd functions whose backward is the
opposite all-to-all. Tokens arrive in shard order, not row order; the mask goes by their global
positions, so nothing is reordered.

GQA: K/V heads go through the all-to-all as they are when N divides Hkv; otherwise they are
repeated up to Hq heads first (autograd sums their gradient back), costing G times the K/V
traffic.

Owns `ulysses_attention` and the all-to-all between the two splits. Does not own the block
arithmetic (`blocks`) or the layout (`zigzag`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from longhaul.errors import LonghaulError
from longhaul.rl.context_parallel.blocks import LocalAttention
from longhaul.rl.context_parallel.zigzag import check_shards, gather_shards, zigzag_positions


def _to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """(B, H, T, ...) sequence shard of all heads -> (B, H / N, N T, ...) every rank's tokens, in
    rank order, of this rank's heads."""
    n = dist.get_world_size(group)
    B, H, T, *rest = x.shape
    send = x.reshape(B, n, H // n, T, *rest).transpose(0, 1).contiguous()  # (N, B, H/N, T, ...): block i to rank i
    got = torch.empty_like(send)  # (N, B, H/N, T, ...): block j from rank j
    dist.all_to_all_single(got, send, group=group)
    return got.permute(1, 2, 0, *range(3, got.dim())).reshape(B, H // n, n * T, *rest)


def _to_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """The inverse of `_to_heads`: (B, H / N, N T, ...) -> (B, H, T, ...)."""
    n = dist.get_world_size(group)
    B, h, NT, *rest = x.shape
    send = x.reshape(B, h, n, NT // n, *rest).permute(2, 0, 1, *range(3, x.dim() + 1)).contiguous()  # (N, B, H/N, T, ...)
    got = torch.empty_like(send)  # block i: rank i's heads of my tokens
    dist.all_to_all_single(got, send, group=group)
    return got.transpose(0, 1).reshape(B, n * h, NT // n, *rest)


class _AllToAll(torch.autograd.Function):
    """`_to_heads` (to_heads=True) or `_to_sequence`, the other one backward."""

    @staticmethod
    def forward(ctx, x, group, to_heads: bool):
        ctx.group, ctx.to_heads = group, to_heads
        return (_to_heads if to_heads else _to_sequence)(x, group)

    @staticmethod
    def backward(ctx, g):
        return (_to_sequence if ctx.to_heads else _to_heads)(g, ctx.group), None, None


def check_heads(hq: int, world: int) -> None:
    """N must divide the query heads, or a one-line error that names the ways out."""
    if hq % world:
        raise LonghaulError(f"Ulysses attention: {hq} query heads do not split over {world} ranks; use ring attention "
                            f"or a context-parallel size that divides {hq}")


def ulysses_attention(q, k, v, doc_ids=None, scale: float | None = None, group=None):
    """Causal attention of this rank's zigzag shard over the whole row, by head all-to-all.

    Takes and returns what `ring_attention` does: q (B, Hq, T, D), k, v (B, Hkv, T, D), doc_ids
    (B, T) or None -> out (B, Hq, T, D), lse (B, Hq, T) fp32. N must divide Hq."""
    world = dist.get_world_size(group)
    check_shards(q, k, v, doc_ids, world)
    check_heads(q.shape[1], world)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if k.shape[1] % world:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    qh, kh, vh = (_AllToAll.apply(t, group, True) for t in (q, k, v))  # (B, H / N, N T, D)
    T = q.shape[2]
    pos = torch.cat([zigzag_positions(T * world, r, world, q.device) for r in range(world)])  # arrival order
    docs = None if doc_ids is None else torch.cat(gather_shards(doc_ids, group), dim=1)  # (B, N T)
    out, lse = LocalAttention.apply(qh, kh, vh, pos, pos, docs, docs, scale)
    return _AllToAll.apply(out, group, False), _AllToAll.apply(lse[..., None], group, False)[..., 0]
