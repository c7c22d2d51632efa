"""The packed training forward with each flat row split over a context-parallel group.

Owns `ContextGroup`: one rank's place in the group, what it does to a `packed_forward.PackedBatch`
(`shard`: this rank's zigzag share of the flat row, its tokens, in-document positions for RoPE,
document ids and the completion tokens it predicts), the step's collectives (`reduce_gradients`,
`sum`, `sum_rows`, `total`), the layout of data-parallel replicas of a group (`grid`) and the
checks of a split (`check_model`, `check_split`). `ContextShard` rides in the sharded batch and is
the attention `packed_forward.hidden_states` calls in place of its own (`ring` or `ulysses`, by
name); everything else in the forward (embeddings, norms, projections, MLP, the LM head) runs on
the local rows unchanged.

How the sums come out equal to one process's: each rank's log-probs are those of the completion
tokens it holds (the sharded batch's mask is 1 there only), so a loss summed over tokens and
divided by a batch-wide count is, summed over ranks, the whole batch's. Every rank holds its
parameters' gradients from its own rows (ring / Ulysses send the K/V gradients back to the ranks
that own those rows), so the whole batch's gradient is their sum over the group. With replicas,
each training other rows under the same batch-wide normalisers, it is the sum over every rank.

Every rank must run the backward, even one that predicts no token: attention's backward is a
collective. It does, since its (empty) log-probs still hang off the hidden states.

Takes layouts where each sequence attends to itself, causally (`pack_pairs`, `pack_targets`), and
`pack_shared`'s prompt shared by several completions, each of which also sees the whole prompt
(`document_ids`). Does not own starting the processes (`runtime.context_trainers`) or attention
itself (`ring`, `ulysses`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.distributed as dist

from longhaul.errors import LonghaulError
from longhaul.models.lora import unwrap
from longhaul.rl.context_parallel import CONTEXT_ATTENTION, mask_ids
from longhaul.rl.context_parallel.zigzag import zigzag_positions, zigzag_shard
from longhaul.rl import packed_forward
from longhaul.rl.packed_forward import PackedBatch

BUCKET = 1 << 24  # gradient elements an all-reduce carries at once (64 MB fp32): few messages, bounded extra memory


@dataclass
class ContextShard:
    """This rank's part of a row split over `group`, as attention needs it."""
    attend: Callable  # CONTEXT_ATTENTION's (q, k, v, doc_ids, scale, group) -> (out, lse)
    doc_ids: torch.Tensor  # (T / N,) the document of each local row: a row attends within its own only
    group: object  # the torch.distributed group; None: the default one

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (n, Hq, D), k, v (n, Hkv, D) of the local rows, RoPE applied -> (n, Hq * D)."""
        n = q.shape[0]
        heads_first = lambda t: t.transpose(0, 1)[None]  # noqa: E731  (n, H, D) -> (1, H, n, D)
        out, _ = self.attend(heads_first(q), heads_first(k), heads_first(v), self.doc_ids.to(q.device)[None], None, self.group)
        return out[0].transpose(0, 1).reshape(n, -1)


def document_ids(b: PackedBatch) -> torch.Tensor:
    """(N,) each flat row's mask id (`blocks.mask_ids`): its document is the attention row that
    queries it; a row whose keys begin with another row's whole sequence before its own (a prompt
    shared by several completions, `pack_shared`) also sees that one. Refuses any other layout."""
    R, Tq = b.q_index.shape
    doc = b.out_index // Tq
    sees = torch.full((R,), -1, dtype=torch.long)
    for r in range(R):
        extra, own = b.kv_index[r, :b.kv_len[r] - b.q_len[r]], b.kv_index[r, b.kv_len[r] - b.q_len[r]:b.kv_len[r]]
        if not len(extra):
            continue
        p = int(doc[extra[0]])
        if not (torch.all(doc[extra] == p) and b.q_len[p] == b.kv_len[p] == len(extra) and extra.max() < own.min()):
            raise LonghaulError("context parallel splits rows that attend to their own sequence and at most one whole "
                                "sequence before it (a shared prompt); this packed layout is neither")
        sees[r] = p
    return mask_ids(doc, sees[doc])


class ContextGroup:
    """One rank of a context-parallel group: every packed row is split over its N ranks.

    group: the ranks that split each row (None: every rank). data: where the process group holds
    several such groups as data-parallel replicas, each training its own share of a step's rows,
    the ranks at this one's place in every replica (`grid`); gradients and metric sums then run
    over every rank, and `total` sums the batch-wide counts over `data`."""

    def __init__(self, attention: str = "ring", group=None, data=None):
        self.attend = CONTEXT_ATTENTION.get_fn(attention)
        self.attention, self.group, self.data = attention, group, data
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.everyone = None if data is not None else group  # whose gradients make the step's

    def check(self, model) -> None:
        """A one-line error when the model cannot be split over this group."""
        check_model(model, self.world, self.attention)

    def shard(self, b: PackedBatch) -> PackedBatch:
        """This rank's zigzag shard of b's flat row, padded first to 2N equal chunks (the pad rows
        are one more sequence, never a target). Targets stay whole; the mask, pick and pick_slot
        keep only the completion tokens predicted by the rows held here."""
        n, world = b.input_ids.numel(), self.world
        pad = -n % (2 * world)
        doc = document_ids(b)
        whole = (torch.cat([b.input_ids, b.input_ids.new_zeros(pad)]),  # any token id: nothing reads a pad row
                 torch.cat([b.positions, torch.arange(pad)]),
                 torch.cat([doc, torch.full((pad,), b.q_index.shape[0], dtype=doc.dtype)]))  # a document of their own
        ids, pos, doc = (zigzag_shard(t, self.rank, world, 0) for t in whole)
        local = torch.full((n + pad,), -1, dtype=torch.long)  # flat row -> its index here, -1: another rank's
        local[zigzag_positions(n + pad, self.rank, world)] = torch.arange((n + pad) // world)
        held = local[b.pick] >= 0
        pick, slot = local[b.pick[held]], b.pick_slot[held]
        mask = torch.zeros_like(b.mask).view(-1).index_copy_(0, slot, b.mask.view(-1)[slot]).view(b.mask.shape)
        empty = torch.empty(0, dtype=torch.long)  # the single-process attention layout: unused here
        return replace(b, input_ids=ids, positions=pos, q_index=empty, kv_index=empty, out_index=empty,
                       pick=pick, pick_slot=slot, mask=mask, q_len=empty, kv_len=empty,
                       context=ContextShard(self.attend, doc, self.group))

    def reduce_gradients(self, params) -> None:
        """Sum the trainable parameters' gradients over the group, in buckets of flat fp32 copies.
        A parameter without a gradient here takes part as zeros (every rank sends the same sizes)."""
        grads = []
        for p in params:
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
        start = 0
        while start < len(grads):
            end, size = start, 0
            while end < len(grads) and (end == start or size + grads[end].numel() <= BUCKET):
                size += grads[end].numel()
                end += 1
            flat = torch.cat([g.reshape(-1) for g in grads[start:end]])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.everyone)
            for g, part in zip(grads[start:end], flat.split([g.numel() for g in grads[start:end]])):
                g.copy_(part.view_as(g))
            start = end

    def sum_rows(self, part: torch.Tensor) -> torch.Tensor:
        """`part` summed over the group, differentiable in this rank's part only: the other ranks'
        shares enter as constants, so a loss of the sum, the same on every rank, backpropagates
        each rank's own share of the gradient, and `reduce_gradients` adds them up."""
        whole = part.detach().clone()
        dist.all_reduce(whole, op=dist.ReduceOp.SUM, group=self.group)
        return part + (whole - part.detach())

    def sum(self, value: float) -> float:
        """A number summed over the ranks (each rank's share of a loss -> the batch's loss)."""
        return self.sum_all([value])[0]

    def sum_all(self, values: list[float]) -> list[float]:
        """Each number summed over the ranks (every replica's too), in one message."""
        return _reduce(values, dist.ReduceOp.SUM, self.everyone)

    def total(self, values: list[float]) -> list[float]:
        """Counts of this replica's rows (the same on each of its ranks) summed over the replicas."""
        return values if self.data is None else _reduce(values, dist.ReduceOp.SUM, self.data)

    def maximum(self, value: float) -> float:
        """The largest of the replicas' values."""
        return value if self.data is None else _reduce([value], dist.ReduceOp.MAX, self.data)[0]


def _reduce(values: list[float], op, group) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


def grid(attention: str, context: int) -> tuple[ContextGroup, int, int]:
    """This rank's `ContextGroup` when the process group is data-parallel replicas of `context`
    ranks each (rank = replica * context + place), with the replica's index and their number.
    Every rank creates every subgroup, in the same order, as torch.distributed requires."""
    world, rank = dist.get_world_size(), dist.get_rank()
    replicas = world // context
    if replicas == 1:
        return ContextGroup(attention), 0, 1
    splits = [dist.new_group(list(range(r * context, (r + 1) * context))) for r in range(replicas)]
    places = [dist.new_group(list(range(c, world, context))) for c in range(context)]
    replica, place = divmod(rank, context)
    return ContextGroup(attention, splits[replica], places[place]), replica, replicas


def check_split(heads: int, world: int, attention: str) -> None:
    """One-line errors for a split that cannot run: a group of `world` ranks, `attention` by name,
    over a model with `heads` query heads (Ulysses splits them over the ranks)."""
    if attention not in CONTEXT_ATTENTION:
        raise LonghaulError(f"train.context_attention: {CONTEXT_ATTENTION.unknown(attention)}")
    if attention == "ulysses" and heads % world:
        raise LonghaulError(f"train.context_attention=ulysses splits the {heads} query heads over train.context_parallel={world} "
                            f"processes, which does not divide them; set train.context_parallel to a divisor of {heads} "
                            f"or train.context_attention=ring")


def check_model(model, world: int, attention: str) -> None:
    """One-line errors for a model whose rows cannot be split over `world` ranks by `attention`: not
    the packed forward's, or (Ulysses) query heads that `world` does not divide."""
    if not packed_forward.supports(model):
        raise LonghaulError(f"train.context_parallel splits rows in the packed forward of Llama / Qwen2 models, not model type "
                            f"{getattr(unwrap(model).config, 'model_type', '?')}; set train.context_parallel=1")
    check_split(unwrap(model).config.num_attention_heads, world, attention)
