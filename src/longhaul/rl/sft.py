"""Supervised fine-tuning: next-token loss on assistant tokens only, with optional packing.

The loss is the sum of token losses over the whole batch divided by the batch's count of
loss tokens, so micro-batch accumulation gives exactly the full-batch gradient. With packing,
rows are grouped first-fit into bins of at most `data.pack_length` tokens (default
`data.max_length`; a longer row gets a bin of its own) and a micro-batch is `micro_batch` bins. For Llama / Qwen2 models the bins' rows run through `packed_forward`: all
rows end to end with no padding in the linears, attention per row, and the LM head and
log-softmax on the target (assistant) positions only, which is most of the saving on
multi-turn rows where tool outputs and prompts are most of the tokens. Other models get HF's
forward over each bin as one sequence, with per-row positions and a block-diagonal causal
mask (its attention holds (bins, heads, L, L) per layer, so keep `max_length` moderate). Either
way a packed batch computes what the padded one does, to rounding.

Context parallel (`train.context_parallel`, a `ContextGroup` given): every rank of the group takes
the same rows and runs its zigzag shard of each packed micro-batch (`context_parallel.packed`).
Its log-probs are those of the loss tokens it holds; the normaliser, the batch's count of loss
tokens, is counted from the whole batch every rank holds, so the ranks' losses sum to the batch's
loss, and their gradients, summed over the group before the step, to its gradient.
"""

from __future__ import annotations

import math

import torch

from longhaul.errors import LonghaulError
from longhaul.malloc import within_step
from longhaul.rl import logprobs, packed_forward
from longhaul.ops.autocast import autocast as autocast_ctx  # a name apart from the `autocast` arguments
from longhaul.rl.logprobs import right_pad
from longhaul.rl.optim import OptimizerState, clip_and_step, make_optimizer

Row = tuple[list[int], list[int]]  # token ids, loss mask (1 on assistant tokens)


def _to_model(model, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`tensors` on the device that holds `model`'s weights."""
    device = next(model.parameters()).device
    return tuple(t.to(device) for t in tensors)


def masked_logprobs(model, seqs: list[Row], pad_id: int, autocast: str = "none"):
    """Per-token log-probs (B, L-1) of ids[1:] given the prefix, and the loss mask (B, L-1)."""
    ids, attn = right_pad([x for x, _ in seqs], pad_id)
    mask = torch.zeros(ids.shape, dtype=torch.float32)
    for b, (_, m) in enumerate(seqs):
        mask[b, : len(m)] = torch.tensor(m, dtype=torch.float32)
    ids, attn, mask = _to_model(model, ids, attn, mask)
    with autocast_ctx(autocast):
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    logits = logits.float()
    logp = (logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)) * mask[:, 1:]
    return logp, mask[:, 1:]


def pack_rows(rows: list[Row], max_length: int) -> list[list[Row]]:
    """First-fit-decreasing bins of rows whose total length is at most `max_length` (a row longer
    than that alone in its bin)."""
    bins: list[list[Row]] = []
    room: list[int] = []
    for row in sorted(rows, key=lambda r: -len(r[0])):
        n = len(row[0])
        for k, free in enumerate(room):
            if n <= free:
                bins[k].append(row)
                room[k] -= n
                break
        else:
            bins.append([row])
            room.append(max_length - n)
    return bins


def packed_logprobs(model, bins: list[list[Row]], pad_id: int, autocast: str = "none"):
    """Like `masked_logprobs` over packed bins: (B, L-1) log-probs and mask, where no token ever
    attends across its row and the first token of every row is never a target."""
    L = max(sum(len(r[0]) for r in b) for b in bins)
    B = len(bins)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    pos = torch.zeros((B, L), dtype=torch.long)
    seg = torch.full((B, L), -1, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.float32)
    for b, rows in enumerate(bins):
        at = 0
        for k, (x, m) in enumerate(rows):
            n = len(x)
            ids[b, at:at + n] = torch.tensor(x)
            pos[b, at:at + n] = torch.arange(n)
            seg[b, at:at + n] = k
            mask[b, at:at + n] = torch.tensor(m, dtype=torch.float32)
            mask[b, at] = 0  # predicted from the previous row's last token: never a target
            at += n
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool))
    attn = causal[None] & (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)  # (B, L, L)
    attn |= torch.eye(L, dtype=torch.bool)[None]  # padding attends to itself: no empty softmax rows
    ids, pos, attn, mask = _to_model(model, ids, pos, attn, mask)
    with autocast_ctx(autocast):
        logits = model(input_ids=ids, attention_mask=attn[:, None], position_ids=pos).logits[:, :-1]
    logits = logits.float()
    logp = (logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)) * mask[:, 1:]
    return logp, mask[:, 1:]


class SFTTrainer(OptimizerState):
    def __init__(self, model, pad_id: int, algo, train, packing: bool = False, max_length: int = 1024, context=None):
        self.model, self.pad_id, self.train_cfg = model, pad_id, train
        self.packing, self.max_length = packing, max_length
        self.context = context  # a `ContextGroup`: each packed micro-batch split over its ranks; None: all here
        if context is not None:
            if not packing:
                raise LonghaulError("train.context_parallel splits each packed row over its processes; set data.packing=true")
            context.check(model)
        self.optimizer, self.scheduler = make_optimizer(model.parameters(), train)

    def _chunks(self, rows: list[Row]):
        mb = self.train_cfg.micro_batch
        if self.packing:
            bins = pack_rows(rows, self.max_length)
            flat = packed_forward.supports(self.model)
            for i in range(0, len(bins), mb):
                if flat:
                    batch = packed_forward.pack_targets([r for b in bins[i:i + mb] for r in b], self.pad_id)
                    if self.context is not None:
                        batch = self.context.shard(batch)
                    logp, mask, _ = logprobs.packed_logprobs(self.model, batch, autocast=self.train_cfg.autocast)
                    yield logp, mask
                else:
                    yield packed_logprobs(self.model, bins[i:i + mb], self.pad_id, self.train_cfg.autocast)
        else:
            for i in range(0, len(rows), mb):
                yield masked_logprobs(self.model, rows[i:i + mb], self.pad_id, self.train_cfg.autocast)

    @staticmethod
    def _loss_tokens(rows: list[Row]) -> float:
        n = float(sum(sum(m[1:]) for _, m in rows))
        if n == 0:
            raise ValueError("batch has no loss tokens (no assistant content)")
        return n

    def backward(self, rows: list[Row]) -> float:
        """The batch's mean token loss, its gradient accumulated into the parameters (under context
        parallel: the group's sums, the same on every rank)."""
        n_tok = self._loss_tokens(rows)
        self.model.train()
        total = 0.0
        for logp, mask in self._chunks(rows):
            loss = -(logp * mask).sum() / n_tok
            loss.backward()
            within_step()  # bound the kept heap between micro-batches (`malloc.within_step`)
            total += loss.item()
        if self.context is not None:
            self.context.reduce_gradients(self.model.parameters())
            total = self.context.sum(total)
        return total

    def step(self, rows: list[Row]) -> dict:
        n_tok = self._loss_tokens(rows)
        total = self.backward(rows)
        lr = self.scheduler.get_last_lr()[0]
        grad_norm = clip_and_step(self.model.parameters(), self.optimizer, self.scheduler, self.train_cfg.grad_clip, total)
        return {"loss": total, "grad_norm": grad_norm, "num_tokens": int(n_tok), "lr": lr}

    @torch.no_grad()
    def evaluate(self, rows: list[Row]) -> dict:
        """Held-out mean token loss and perplexity on assistant tokens."""
        n_tok = self._loss_tokens(rows)
        self.model.eval()
        total = sum(-(logp * mask).sum().item() for logp, mask in self._chunks(rows)) / n_tok
        if self.context is not None:
            total = self.context.sum(total)
        return {"heldout/loss": total, "heldout/ppl": math.exp(min(total, 50.0))}
