"""Direct preference optimisation: sigmoid (Rafailov et al. 2023) and IPO (Azar et al. 2023)
losses over (prompt, chosen, rejected) pairs. Reference log-probs are computed once, before
training, so the reference model is not kept in memory during updates.

A loss sees one score per answer: its summed token log-probs, or for the losses named in
`MEAN_LOGPROB_LOSSES` their per-token mean (TRL's `ipo` convention).

Context parallel (`train.context_parallel`, a `ContextGroup` given): a micro-batch's chosen and
rejected answers are laid end to end in one packed row and every rank runs its zigzag shard of
it (`context_parallel.packed`); each rank sums the log-probs of the answer tokens it holds, and
the group's sum is each answer's score, so every rank computes the same loss while its backward
carries only its own tokens' share (summed over the group by `reduce_gradients`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longhaul.errors import LonghaulError
from longhaul.malloc import within_step
from longhaul.rl import logprobs, packed_forward
from longhaul.rl.data import encode_prompt_completion
from longhaul.rl.optim import OptimizerState, clip_and_step, make_optimizer
from longhaul.rl.registry import Registry
from longhaul.rl.sft import masked_logprobs

DPO_LOSSES = Registry("DPO loss")
MEAN_LOGPROB_LOSSES = {"ipo_norm"}  # scored on per-token mean log-probs, not sums


@DPO_LOSSES.register("sigmoid")
def dpo_sigmoid(pi_c, pi_r, ref_c, ref_r, beta: float = 0.1):
    """Sequence log-probs (B,) -> per-pair loss (B,): -log sigmoid(beta * margin)."""
    return -F.logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))


@DPO_LOSSES.register("ipo")
def dpo_ipo(pi_c, pi_r, ref_c, ref_r, beta: float = 0.1):
    """IPO: (margin - 1 / (2 beta))^2, with the margin of summed log-ratios.

    The paper (Eq. 17) writes sequence log-probs, i.e. sums; on sums the squared loss grows
    with answer length. See `ipo_norm` for the length-normalised form TRL uses."""
    return ((pi_c - ref_c) - (pi_r - ref_r) - 1 / (2 * beta)) ** 2


@DPO_LOSSES.register("ipo_norm")
def dpo_ipo_norm(pi_c, pi_r, ref_c, ref_r, beta: float = 0.1):
    """IPO on per-token mean log-probs (B,), as TRL's `loss_type="ipo"` computes it: TRL
    divides each summed log-ratio by its completion length, a normalisation the IPO authors
    confirmed to TRL matches the paper's experiments. Same formula as `ipo`; the trainer
    feeds it means because the name is in `MEAN_LOGPROB_LOSSES`."""
    return dpo_ipo(pi_c, pi_r, ref_c, ref_r, beta)


def encode_pairs(tok, rows: list[dict]):
    out = []
    for r in rows:
        out.append((encode_prompt_completion(tok, r["prompt"], r["chosen"]), encode_prompt_completion(tok, r["prompt"], r["rejected"])))
    return out


def sequence_logprobs(model, seqs, pad_id: int, autocast: str = "none", mean: bool = False) -> torch.Tensor:
    """Log-prob (B,) of each sequence's loss tokens: their sum, or with `mean` their per-token mean."""
    logp, mask = masked_logprobs(model, seqs, pad_id, autocast)
    total = (logp * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if mean else total


def _key(item) -> int:
    """An item's reference key, by content: a copy of the item (the rows a context-parallel rank
    receives from rank 0) finds the score computed for the original."""
    (c, cm), (r, rm) = item
    return hash((tuple(c), tuple(cm), tuple(r), tuple(rm)))


class DPOTrainer(OptimizerState):
    """DPO on items ((chosen ids, mask), (rejected ids, mask)). The reference is the model as it
    is at construction (the base weights; with LoRA the adapters are still zero), scored once
    over every item the run will see, so no reference model stays in memory."""

    def __init__(self, model, pad_id: int, algo, train, items: list, context=None):
        self.model, self.pad_id, self.beta, self.train_cfg = model, pad_id, algo.beta, train
        self.loss_fn = DPO_LOSSES.get_fn(algo.dpo_loss)
        self.mean = algo.dpo_loss in MEAN_LOGPROB_LOSSES
        self.context = context  # a `ContextGroup`: each micro-batch's answers split over its ranks; None: all here
        if context is not None:
            if not packed_forward.supports(model):
                raise LonghaulError("train.context_parallel splits DPO answers in the packed forward of Llama / Qwen2 models; "
                                    "set train.context_parallel=1")
            context.check(model)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            ref_c, ref_r = self._score(items)
        model.train(was_training)
        self._ref = {_key(item): (c, r) for item, c, r in zip(items, ref_c, ref_r)}
        self.optimizer, self.scheduler = make_optimizer(model.parameters(), train)

    def _score(self, items: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence scores (N,) of every chosen and every rejected answer, in micro-batches."""
        mb = self.train_cfg.micro_batch
        parts = [self._answers(items[i:i + mb]) for i in range(0, len(items), mb)]
        return torch.cat([c for c, _ in parts]), torch.cat([r for _, r in parts])

    def _answers(self, chunk: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores (B,) of a micro-batch's chosen and of its rejected answers."""
        ac = self.train_cfg.autocast
        if self.context is None:
            return (sequence_logprobs(self.model, [it[0] for it in chunk], self.pad_id, ac, self.mean),
                    sequence_logprobs(self.model, [it[1] for it in chunk], self.pad_id, ac, self.mean))
        seqs = [it[0] for it in chunk] + [it[1] for it in chunk]
        batch = self.context.shard(packed_forward.pack_targets(seqs, self.pad_id))
        logp, mask, _ = logprobs.packed_logprobs(self.model, batch, autocast=ac)
        total = self.context.sum_rows((logp * mask).sum(-1))  # the answer tokens held here, then the group's
        if self.mean:
            total = total / torch.tensor([max(1, sum(m[1:])) for _, m in seqs], dtype=total.dtype, device=total.device)
        return total[:len(chunk)], total[len(chunk):]

    def _reference(self, items: list) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            pairs = [self._ref[_key(it)] for it in items]
        except KeyError:
            raise ValueError("DPO item without a reference score: pass every item to the constructor") from None
        return torch.stack([c for c, _ in pairs]), torch.stack([r for _, r in pairs])

    def backward(self, items: list) -> dict:
        """The batch's loss, preference accuracy and margin, its gradient accumulated into the
        parameters (under context parallel: the group's, the same on every rank)."""
        self.model.train()
        n, total, correct, margin = len(items), 0.0, 0, 0.0
        mb = self.train_cfg.micro_batch
        for i in range(0, n, mb):
            chunk = items[i:i + mb]
            chosen, rejected = self._answers(chunk)
            ref_c, ref_r = self._reference(chunk)
            loss = self.loss_fn(chosen, rejected, ref_c, ref_r, self.beta).sum() / n
            loss.backward()
            within_step()  # bound the kept heap between micro-batches (`malloc.within_step`)
            total += loss.item()
            m = ((chosen - ref_c) - (rejected - ref_r)).detach()
            correct += int((m > 0).sum())
            margin += self.beta * m.sum().item()
        if self.context is not None:
            self.context.reduce_gradients(self.model.parameters())
        return {"loss": total, "rewards/accuracies": correct / n, "rewards/margins": margin / n}

    def step(self, items: list) -> dict:
        out = self.backward(items)
        lr = self.scheduler.get_last_lr()[0]
        grad_norm = clip_and_step(self.model.parameters(), self.optimizer, self.scheduler, self.train_cfg.grad_clip, out["loss"])
        return {**out, "grad_norm": grad_norm, "lr": lr}

    @torch.no_grad()
    def evaluate(self, items: list) -> dict:
        """Held-out preference accuracy (implicit reward of chosen above rejected) and margin."""
        self.model.eval()
        c, r = self._score(items)
        ref_c, ref_r = self._reference(items)
        m = (c - ref_c) - (r - ref_r)
        return {"heldout/accuracy": (m > 0).float().mean().item(), "heldout/margin": self.beta * m.mean().item()}

    def accuracy(self, items: list) -> float:
        return self.evaluate(items)["heldout/accuracy"]
