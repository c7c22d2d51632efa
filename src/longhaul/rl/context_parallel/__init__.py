"""Context-parallel attention: one long (packed) row split over the N ranks of a process group,
each holding a zigzag shard of its tokens, attending causally over the whole row. Works over
torch.distributed with any backend that has point-to-point and all-to-all (gloo on CPU, NCCL).

Two ways, the same call (`CONTEXT_ATTENTION`, by name: (q, k, v, doc_ids, scale, group) ->
(out, lse), shards in and out):
- `ring` (`ring.ring_attention`): K/V go round the ring, one hop a step, overlapped with the
  block being computed. Any head count. Each device sends (N - 1) / N of the row's K/V forward
  (2 T Hkv D (N - 1) / N values; twice that backward, with dK/dV), which does not fall as N
  grows, but hides behind compute when shards are long. The better choice for very long rows
  and small batches, few heads (or few K/V heads), or N beyond the head count.
- `ulysses` (`ulysses.ulysses_attention`): two all-to-alls trade the sequence split for a head
  split and back; the local step is ordinary attention over whole rows. Each device sends
  (N - 1) / N of its own q, k, v and output shards (about 4 T H D / N values): the volume per
  device falls as N grows and stays constant when T and N grow together. But N must divide the
  query heads, and the all-to-alls are not overlapped with compute. The better choice when the
  heads divide by N and the interconnect is fast (within a node).

Layout helpers (`zigzag`): cut a row for a rank, gather it back, the global positions of a
shard (the mask, and RoPE for an unpacked row) and the in-document positions of a packed row
(RoPE), to shard like the tokens.

Packed rows: `doc_ids` (B, T), a document id per token of the shard; a token attends only
within its document, causally, and, where its id says so (`blocks.mask_ids`), to one other
document before it: a prompt shared by several completions (`pack_shared`). Not owned here: the
model's forward (RoPE, projections; see `rl.packed_forward`) or starting processes. The blocks are plain torch matmuls that
materialise a score block per head (ring: (T / N) x (T / N); Ulysses: the whole T x T): a fused
kernel with a log-sum-exp output (FlashAttention) is the next step on GPUs.
"""

from longhaul.rl.context_parallel.blocks import mask_ids
from longhaul.rl.context_parallel.ring import ring_attention
from longhaul.rl.context_parallel.ulysses import ulysses_attention
from longhaul.rl.context_parallel.zigzag import (document_positions, zigzag_gather, zigzag_positions, zigzag_shard,
                                                 zigzag_unshard)
from longhaul.rl.registry import Registry

CONTEXT_ATTENTION = Registry("context-parallel attention")
CONTEXT_ATTENTION["ring"] = ring_attention
CONTEXT_ATTENTION["ulysses"] = ulysses_attention

__all__ = ["CONTEXT_ATTENTION", "document_positions", "mask_ids", "ring_attention", "ulysses_attention", "zigzag_gather",
           "zigzag_positions", "zigzag_shard", "zigzag_unshard"]
