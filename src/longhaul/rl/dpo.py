"""Direct preference optimisation: sigmoid (Rafailov et al. 2023) and IPO (Azar et al. 2023)
losses over (prompt, chosen, rejected) pairs. Reference log-probs are computed once, before
training, so the reference model is not kept in memory during updates.

A loss sees one score per answer: its summed token log-probs, or for the losses named in
`MEAN_LOGPROB_LOSSES` their per-token mean (TRL's `ipo` convention)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longhaul.malloc import within_step
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


class DPOTrainer(OptimizerState):
    """DPO on items ((chosen ids, mask), (rejected ids, mask)). The reference is the model as it
    is at construction (the base weights; with LoRA the adapters are still zero), scored once
    over every item the run will see, so no reference model stays in memory."""

    def __init__(self, model, pad_id: int, algo, train, items: list):
        self.model, self.pad_id, self.beta, self.train_cfg = model, pad_id, algo.beta, train
        self.loss_fn = DPO_LOSSES.get_fn(algo.dpo_loss)
        self.mean = algo.dpo_loss in MEAN_LOGPROB_LOSSES
        was_training = model.training
        model.eval()
        with torch.no_grad():
            ref_c, ref_r = self._score(items)
        model.train(was_training)
        self._ref = {id(item): (c, r) for item, c, r in zip(items, ref_c, ref_r)}
        self._items = items  # keeps the ids above valid
        self.optimizer, self.scheduler = make_optimizer(model.parameters(), train)

    def _score(self, items: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence scores (N,) of every chosen and every rejected answer, in micro-batches."""
        mb, ac = self.train_cfg.micro_batch, self.train_cfg.autocast
        return tuple(torch.cat([sequence_logprobs(self.model, [it[side] for it in items[i:i + mb]], self.pad_id, ac, self.mean)
                                for i in range(0, len(items), mb)]) for side in (0, 1))

    def _reference(self, items: list) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            pairs = [self._ref[id(it)] for it in items]
        except KeyError:
            raise ValueError("DPO item without a reference score: pass every item to the constructor") from None
        return torch.stack([c for c, _ in pairs]), torch.stack([r for _, r in pairs])

    def step(self, items: list) -> dict:
        self.model.train()
        n, total, correct, margin = len(items), 0.0, 0, 0.0
        mb, ac = self.train_cfg.micro_batch, self.train_cfg.autocast
        for i in range(0, n, mb):
            chunk = items[i:i + mb]
            chosen = sequence_logprobs(self.model, [it[0] for it in chunk], self.pad_id, ac, self.mean)
            rejected = sequence_logprobs(self.model, [it[1] for it in chunk], self.pad_id, ac, self.mean)
            ref_c, ref_r = self._reference(chunk)
            loss = self.loss_fn(chosen, rejected, ref_c, ref_r, self.beta).sum() / n
            loss.backward()
            within_step()  # bound the kept heap between micro-batches (`malloc.within_step`)
            total += loss.item()
            m = ((chosen - ref_c) - (rejected - ref_r)).detach()
            correct += int((m > 0).sum())
            margin += self.beta * m.sum().item()
        lr = self.scheduler.get_last_lr()[0]
        grad_norm = clip_and_step(self.model.parameters(), self.optimizer, self.scheduler, self.train_cfg.grad_clip, total)
        return {"loss": total, "rewards/accuracies": correct / n, "rewards/margins": margin / n, "grad_norm": grad_norm, "lr": lr}

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
