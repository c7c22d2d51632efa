"""Attention of a block of queries over a block of keys, with the softmax's log-sum-exp: the
arithmetic that ring attention repeats once a ring step and Ulysses runs once over the whole row.

Owns the mask (causal by global position, within a document when rows are packed, or a document
and the one it also sees: `mask_ids`), one block's
forward (output normalised over the block, and its log-sum-exp), the online-softmax merge of a
block into the running result, one block's backward from the final log-sum-exp (probabilities
recomputed, never stored), and `LocalAttention`, all of it over one whole block. Does not own
communication (`ring`, `ulysses`) or the layout of shards (`zigzag`).

GQA without repeating K/V: the G = Hq / Hkv query heads that share a K/V head are folded into
the query length, so one matmul over (B, Hkv, G * Tq, D) serves them and the K/V gradient sums
over G by itself. Matmuls run in the inputs' dtype; the softmax, the running output and the
gradients are fp32, as in FlashAttention.
"""

from __future__ import annotations

import torch


SEES = 1 << 32  # a mask id's multiple of this: 1 + the document its tokens also see (0: none)


def mask_ids(doc: torch.Tensor, sees: torch.Tensor | None = None) -> torch.Tensor:
    """The document ids `allowed` takes: `doc` each token's document (0 <= doc < SEES) and, where
    given, `sees` the one other document its tokens also attend to (-1: none), e.g. the prompt
    that several completions share. Without `sees` the ids are the documents themselves."""
    return doc if sees is None else doc + (sees + 1) * SEES


def allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, q_doc=None, k_doc=None) -> torch.Tensor:
    """(Tq,), (Tk,) global positions, optionally (B, Tq), (B, Tk) document ids (`mask_ids`) ->
    (B or 1, Tq, Tk) True where the query may see the key: at or before it, in the same document
    or in the document the query's own also sees."""
    ok = k_pos[None, None, :] <= q_pos[None, :, None]
    if q_doc is not None:
        key = (k_doc % SEES)[:, None, :]
        ok = ok & (((q_doc % SEES)[:, :, None] == key) | ((q_doc // SEES - 1)[:, :, None] == key))
    return ok


def _scores(q, k, ok, scale) -> torch.Tensor:
    """q (B, Hkv, G, Tq, D), k (B, Hkv, Tk, D) -> fp32 scaled scores (B, Hkv, G, Tq, Tk), -inf where masked."""
    B, Hkv, G, Tq, D = q.shape
    s = (q.reshape(B, Hkv, G * Tq, D) @ k.transpose(-1, -2)).view(B, Hkv, G, Tq, -1).float() * scale
    return s.masked_fill(~ok[:, None, None], float("-inf"))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in b's dtype, the product in fp32."""
    return (a.to(b.dtype) @ b).float()


TILE_SCORES = 1 << 23  # fp32 scores (32 MB) a tile of a block's queries holds at once


def _tiles(q: torch.Tensor, tk: int) -> list[slice]:
    """The block's query rows in tiles whose scores (and the backward's probabilities and their
    gradient) stay under TILE_SCORES each, so a block's working memory does not grow with the
    square of the shard's length."""
    B, Hkv, G, Tq, _ = q.shape
    rows = max(1, TILE_SCORES // max(1, B * Hkv * G * tk))
    return [slice(i, min(Tq, i + rows)) for i in range(0, Tq, rows)]


def block_forward(q, k, v, ok, scale: float):
    """q (B, Hkv, G, Tq, D), k, v (B, Hkv, Tk, D), ok (B or 1, Tq, Tk) -> out (B, Hkv, G, Tq, D)
    normalised over this block and lse (B, Hkv, G, Tq), both fp32; lse is -inf (and out 0) for a
    query that sees no key of the block. Queries run in tiles (`_tiles`); each row's result is
    that of the whole block."""
    tiles = _tiles(q, k.shape[2])
    if len(tiles) == 1:
        return _block_forward(q, k, v, ok, scale)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    for t in tiles:
        out[..., t, :], lse[..., t] = _block_forward(q[..., t, :], k, v, ok[:, t], scale)
    return out, lse


def _block_forward(q, k, v, ok, scale: float):
    B, Hkv, G, Tq, D = q.shape
    s = _scores(q, k, ok, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])  # a row with no key stays 0, not nan
    return _mm(p.view(B, Hkv, G * Tq, -1), v).view(B, Hkv, G, Tq, D), lse


def merge(out, lse, block_out, block_lse):
    """The online softmax: the running (out, lse) with one more block's folded in. `lse` must be
    finite (the first block a query meets holds its own key); `block_lse` may be -inf."""
    new = torch.logaddexp(lse, block_lse)
    return out * torch.exp(lse - new)[..., None] + block_out * torch.exp(block_lse - new)[..., None], new


def block_backward(q, k, v, dout, lse, delta, ok, scale: float):
    """One block's share of the gradients. q, dout (B, Hkv, G, Tq, D); k, v (B, Hkv, Tk, D); lse
    (B, Hkv, G, Tq) the final log-sum-exp over all keys; delta (B, Hkv, G, Tq) rowsum(dout * out)
    less the lse's own gradient -> dq (B, Hkv, G, Tq, D), dk, dv (B, Hkv, Tk, D), all fp32. In
    tiles of queries as `block_forward`; dk and dv sum over the tiles."""
    tiles = _tiles(q, k.shape[2])
    if len(tiles) == 1:
        return _block_backward(q, k, v, dout, lse, delta, ok, scale)
    dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for t in tiles:
        dq[..., t, :], dk_t, dv_t = _block_backward(q[..., t, :], k, v, dout[..., t, :], lse[..., t], delta[..., t], ok[:, t], scale)
        dk += dk_t
        dv += dv_t
    return dq, dk, dv


def _block_backward(q, k, v, dout, lse, delta, ok, scale: float):
    B, Hkv, G, Tq, D = q.shape
    p = torch.exp(_scores(q, k, ok, scale) - lse[..., None])  # the final probabilities of this block's keys
    do = dout.reshape(B, Hkv, G * Tq, D)
    dv = _mm(p.view(B, Hkv, G * Tq, -1).transpose(-1, -2), do)
    dp = _mm(do, v.transpose(-1, -2)).view(p.shape)
    ds = (p * (dp - delta[..., None]) * scale).view(B, Hkv, G * Tq, -1)  # d loss / d raw scores
    dq = _mm(ds, k).view(B, Hkv, G, Tq, D)
    dk = _mm(ds.transpose(-1, -2), q.reshape(B, Hkv, G * Tq, D))
    return dq, dk, dv


def grouped(t: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, Hq, T, ...) -> (B, Hkv, G, T, ...): query head h uses K/V head h // G (HF's repeat_kv order)."""
    return t.view(t.shape[0], hkv, t.shape[1] // hkv, *t.shape[2:])


def delta(dout, out, dlse) -> torch.Tensor:
    """(B, Hq, T, D) twice, (B, Hq, T) or None -> (B, Hq, T) fp32: the softmax backward's row term."""
    d = (dout.float() * out.float()).sum(-1)
    return d if dlse is None else d - dlse.float()


class LocalAttention(torch.autograd.Function):
    """Masked attention of q over all of k, v on one process, as one block: q (B, Hq, Tq, D),
    k, v (B, Hkv, Tk, D), positions (Tq,), (Tk,), document ids (B, Tq), (B, Tk) or None ->
    out (B, Hq, Tq, D), lse (B, Hq, Tq). Saves the inputs, out and lse, not the probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, q_pos, k_pos, q_doc, k_doc, scale: float):
        ok = allowed(q_pos, k_pos, q_doc, k_doc)
        out, lse = block_forward(grouped(q, k.shape[1]), k, v, ok, scale)
        out, lse = out.flatten(1, 2).to(q.dtype), lse.flatten(1, 2)
        ctx.save_for_backward(q, k, v, out, lse, ok)
        ctx.scale = scale
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, ok = ctx.saved_tensors
        hkv = k.shape[1]
        dq, dk, dv = block_backward(grouped(q, hkv), k, v, grouped(dout, hkv), grouped(lse, hkv),
                                    grouped(delta(dout, out, dlse), hkv), ok, ctx.scale)
        return dq.flatten(1, 2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None
