"""Ring attention: each rank keeps its queries and passes its keys and values round the ring.

Over N ranks in the zigzag layout (`zigzag`), ring step s gives rank r the K/V shard of rank
(r - s) mod N, sent on by its neighbour while the current shard's block is computed (isend /
irecv, so the next shard is in flight during the matmuls). The output builds up by the online
softmax (`blocks.merge`); the backward passes K/V round again together with their gradient
accumulators (dK, dV), each rank adding its queries' share before sending them on, so after N
steps and one last hop every accumulator is home. dQ stays local; the probabilities are
recomputed from the saved log-sum-exp.

The zigzag layout halves every off-diagonal step: at a step from an earlier rank (src < r) all
of r's queries see only the first of src's chunks; from a later rank only r's second chunk sees
anything (all of src's). Step 0, r's own shard, is the causal diagonal.

Deviation from the papers (Liu et al. 2023; zigzag as in ring-flash-attention): document masks
of packed rows come from every rank's document ids, gathered once a forward (B x T integers),
not passed round with K/V. The dK/dV accumulators travel in fp32.

Owns the ring exchange and `ring_attention`. Does not own the block arithmetic (`blocks`), the
layout (`zigzag`), or RoPE (applied to q and k before the call, at `zigzag_positions`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from longhaul.rl.context_parallel.blocks import allowed, block_backward, block_forward, delta, grouped, merge
from longhaul.rl.context_parallel.zigzag import check_shards, gather_shards, zigzag_positions

KV, GRAD = 0, 1  # message tags: K/V and their gradients are in flight together in the backward


class Ring:
    """A rank's place in the group's ring: who sends to it (prev), whom it sends to (next)."""

    def __init__(self, group=None):
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(self.world))
        self.next, self.prev = ranks[(self.rank + 1) % self.world], ranks[(self.rank - 1) % self.world]

    def pass_on(self, t: torch.Tensor, tag: int) -> Pending:
        """Send t to next and receive the same shape from prev, without waiting."""
        return Pending(t, self, tag)


class Pending:
    """One hop in flight; `wait()` returns what prev sent."""

    def __init__(self, t: torch.Tensor, ring: Ring, tag: int):
        self.received = torch.empty_like(t)
        self.requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, ring.next, ring.group, tag),
                                                dist.P2POp(dist.irecv, self.received, ring.prev, ring.group, tag)])

    def wait(self) -> torch.Tensor:
        for r in self.requests:
            r.wait()
        return self.received


def _parts(src: int, rank: int, t: int) -> tuple[slice, slice]:
    """Which of rank's queries and src's keys (shard length t) a zigzag ring step needs."""
    if src == rank:
        return slice(None), slice(None)
    return (slice(None), slice(None, t // 2)) if src < rank else (slice(t // 2, None), slice(None))


def _steps(ring: Ring, t: int, docs: list, device):
    """The ring steps, in order: (last step?, rank's query part, the key part of the K/V shard
    held at this step, the mask between them (B or 1, Tq, Tk))."""
    pos = [zigzag_positions(t * ring.world, r, ring.world, device) for r in range(ring.world)]
    for step in range(ring.world):
        src = (ring.rank - step) % ring.world
        qs, ks = _parts(src, ring.rank, t)
        q_doc, k_doc = (None, None) if docs[src] is None else (docs[ring.rank][:, qs], docs[src][:, ks])
        ok = allowed(pos[ring.rank][qs], pos[src][ks], q_doc, k_doc)
        yield step == ring.world - 1, qs, ks, ok


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, doc_ids, scale: float, group):
        ring = Ring(group)
        docs = gather_shards(doc_ids, group) if doc_ids is not None else [None] * ring.world
        q5 = grouped(q, k.shape[1])  # (B, Hkv, G, T, D)
        kv = torch.stack([k, v])  # (2, B, Hkv, T, D): one message a step
        out = lse = None
        for last, qs, ks, ok in _steps(ring, q.shape[2], docs, q.device):
            pending = None if last else ring.pass_on(kv, KV)
            block = block_forward(q5[..., qs, :], kv[0][..., ks, :], kv[1][..., ks, :], ok, scale)
            if out is None:  # step 0: the diagonal, every query sees itself, so lse is finite from here on
                out, lse = block
            else:
                out[..., qs, :], lse[..., qs] = merge(out[..., qs, :], lse[..., qs], *block)
            if pending is not None:
                kv = pending.wait()
        out, lse = out.flatten(1, 2).to(q.dtype), lse.flatten(1, 2)  # (B, Hq, T, D), (B, Hq, T)
        ctx.save_for_backward(q, k, v, out, lse, *(d for d in docs if d is not None))
        ctx.scale, ctx.group = scale, group
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *docs = ctx.saved_tensors
        ring = Ring(ctx.group)
        hkv = k.shape[1]
        q5, do5, lse5, delta5 = (grouped(t, hkv) for t in (q, dout, lse, delta(dout, out, dlse)))
        dq = torch.zeros(q5.shape, dtype=torch.float32, device=q.device)
        kv, incoming = torch.stack([k, v]), None
        for last, qs, ks, ok in _steps(ring, q.shape[2], docs or [None] * ring.world, q.device):
            pending = None if last else ring.pass_on(kv, KV)
            dq_b, dk_b, dv_b = block_backward(q5[..., qs, :], kv[0][..., ks, :], kv[1][..., ks, :], do5[..., qs, :],
                                              lse5[..., qs], delta5[..., qs], ok, ctx.scale)
            dq[..., qs, :] += dq_b
            # the accumulator of the K/V shard held now, with the shares of the ranks it has passed
            dkv = torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device) if incoming is None else incoming.wait()
            dkv[0][..., ks, :] += dk_b
            dkv[1][..., ks, :] += dv_b
            if ring.world > 1:  # on to the next rank; after the last step, that is the shard's owner
                incoming = ring.pass_on(dkv, GRAD)
            if pending is not None:
                kv = pending.wait()
        if incoming is not None:
            dkv = incoming.wait()
        return dq.flatten(1, 2).to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None


def ring_attention(q, k, v, doc_ids=None, scale: float | None = None, group=None):
    """Causal attention of this rank's zigzag shard over the whole row, by ring.

    q (B, Hq, T, D), k, v (B, Hkv, T, D) with Hq a multiple of Hkv, each rank's `zigzag_shard` of
    the row (RoPE already applied at the shard's positions); doc_ids (B, T) the shard's document
    ids for packed rows (a token sees only its own document) or None. Returns out (B, Hq, T, D)
    and the log-sum-exp (B, Hq, T) fp32, both differentiable. scale: 1 / sqrt(D) by default."""
    check_shards(q, k, v, doc_ids, dist.get_world_size(group))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), doc_ids, scale, group)
