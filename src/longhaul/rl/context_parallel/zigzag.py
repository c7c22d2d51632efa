"""The zigzag layout of a sequence over the ranks of a context-parallel group.

A row of T tokens is cut into 2N equal chunks; rank r holds chunks r and 2N-1-r, side by side.
Under a causal mask the early chunks see few keys and the late ones many, so pairing the r-th
earliest with the r-th latest gives every rank the same attention work.

Owns the cut (`zigzag_shard`), its inverse (`zigzag_unshard`; `zigzag_gather` across the group,
by `gather_shards`), the global positions a shard holds (`zigzag_positions`: the causal mask
and, for an unpacked row, RoPE), a packed row's positions within its documents
(`document_positions`, RoPE's positions before sharding), and the checks on shards
(`check_divisible`, `check_shards`). Does not own attention (`ring`, `ulysses`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from longhaul.errors import LonghaulError


def check_divisible(seq_len: int, world: int) -> None:
    """A row splits into 2 x world zigzag chunks, or a one-line error that names the padding."""
    if seq_len % (2 * world):
        raise LonghaulError(f"context parallel: a row of {seq_len} tokens does not split into 2 x {world} equal zigzag "
                            f"chunks; pad each packed row to a multiple of {2 * world} tokens")


def check_shards(q, k, v, doc_ids, world: int) -> None:
    """One-line errors for shards attention cannot take: q (B, Hq, T, D), k, v (B, Hkv, T, D),
    doc_ids (B, T) or None, T two equal zigzag chunks."""
    # (B, T) is shape[::2] of a 4-d shape; q and k agree on it and on D, k and v on everything
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[::2] != k.shape[::2] or q.shape[3] != k.shape[3]:
        raise LonghaulError(f"context-parallel attention takes q (B, Hq, T, D) and k, v (B, Hkv, T, D); "
                            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise LonghaulError(f"attention: {q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads; "
                            f"check the model's num_key_value_heads")
    if q.shape[2] % 2:
        raise LonghaulError(f"context parallel: a rank's shard of {q.shape[2]} tokens is not the two equal zigzag chunks it "
                            f"needs; pad each row to a multiple of {2 * world} tokens and cut it with zigzag_shard")
    if doc_ids is not None and tuple(doc_ids.shape) != (q.shape[0], q.shape[2]):
        raise LonghaulError(f"context parallel: doc_ids of shape {tuple(doc_ids.shape)} do not match the shard's (B, T) = "
                            f"{(q.shape[0], q.shape[2])}; shard them like the tokens")


def zigzag_shard(x: torch.Tensor, rank: int, world: int, dim: int) -> torch.Tensor:
    """Rank `rank`'s share of x along `dim` (T -> T / world): chunks rank and 2 world - 1 - rank."""
    check_divisible(x.shape[dim], world)
    chunks = x.chunk(2 * world, dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim)


def zigzag_unshard(shards: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The whole sequence from every rank's shard, in rank order (the inverse of `zigzag_shard`)."""
    halves = [s.chunk(2, dim) for s in shards]
    # first halves are chunks 0 .. N-1 in rank order; second halves chunks N .. 2N-1 in reverse
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


def gather_shards(x: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every rank's x (same shape on each), in rank order, on every rank; no autograd."""
    shards = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, x.contiguous(), group=group)
    return shards


def zigzag_gather(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """The whole sequence on every rank from each rank's shard x (no autograd: for results)."""
    return zigzag_unshard(gather_shards(x, group), dim)


def zigzag_positions(seq_len: int, rank: int, world: int, device=None) -> torch.Tensor:
    """(seq_len / world,) the global positions, in the row of `seq_len` tokens, of rank's shard."""
    check_divisible(seq_len, world)
    c = seq_len // (2 * world)
    first, second = rank * c, (2 * world - 1 - rank) * c
    return torch.cat([torch.arange(first, first + c, device=device), torch.arange(second, second + c, device=device)])


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document id of each token of whole packed rows -> (B, T) its position within its
    document (RoPE's positions; shard them like the tokens). A document is a run of equal ids."""
    t = torch.arange(doc_ids.shape[-1], device=doc_ids.device).expand_as(doc_ids)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[..., 1:] = doc_ids[..., 1:] != doc_ids[..., :-1]
    return t - torch.where(starts, t, 0).cummax(-1).values
