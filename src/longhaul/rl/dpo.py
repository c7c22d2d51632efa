"""Direct preference optimisation: sigmoid (Rafailov et al. 2023) and IPO (Azar et al. 2023)
losses over (prompt, chosen, rejected) pairs. Reference log-probs are computed once, before
training, so the reference model is not kept in memory during updates."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longhaul.rl.data import encode_prompt_completion
from longhaul.rl.registry import Registry
from longhaul.rl.sft import masked_logprobs

DPO_LOSSES = Registry("DPO loss")


@DPO_LOSSES.register("sigmoid")
def dpo_sigmoid(pi_c, pi_r, ref_c, ref_r, beta: float = 0.1):
    """Sequence log-probs (B,) -> per-pair loss (B,): -log sigmoid(beta * margin)."""
    return -F.logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))


@DPO_LOSSES.register("ipo")
def dpo_ipo(pi_c, pi_r, ref_c, ref_r, beta: float = 0.1):
    """IPO: (margin - 1 / (2 beta))^2, with the margin of summed log-ratios."""
    return ((pi_c - ref_c) - (pi_r - ref_r) - 1 / (2 * beta)) ** 2


def encode_pairs(tok, rows: list[dict]):
    out = []
    for r in rows:
        out.append((encode_prompt_completion(tok, r["prompt"], r["chosen"]), encode_prompt_completion(tok, r["prompt"], r["rejected"])))
    return out


def sequence_logprobs(model, seqs, pad_id: int, autocast: str = "none") -> torch.Tensor:
    logp, mask = masked_logprobs(model, seqs, pad_id, autocast)
    return (logp * mask).sum(-1)


class DPOTrainer:
    def __init__(self, model, ref_model, pad_id: int, pairs, beta: float = 0.1, loss: str = "sigmoid", lr: float = 1e-5,
                 micro_batch: int = 8, autocast: str = "none"):
        self.model, self.pad_id, self.pairs, self.beta, self.micro_batch, self.autocast = model, pad_id, pairs, beta, micro_batch, autocast
        self.loss_fn = DPO_LOSSES.get_fn(loss)
        with torch.no_grad():  # the reference is needed once, then can be freed by the caller
            self.ref_c, self.ref_r = self._score_all(ref_model)
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, foreach=False)

    def _score_all(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence log-probs (N,) of every chosen and every rejected answer, in micro-batches."""
        mb, pairs = self.micro_batch, self.pairs
        return tuple(torch.cat([sequence_logprobs(model, [p[side] for p in pairs[i:i + mb]], self.pad_id, self.autocast)
                                for i in range(0, len(pairs), mb)]) for side in (0, 1))

    def step(self, indices: list[int]) -> dict:
        self.model.train()
        n, total, correct = len(indices), 0.0, 0
        for i in range(0, n, self.micro_batch):
            idx = indices[i:i + self.micro_batch]
            chosen = sequence_logprobs(self.model, [self.pairs[j][0] for j in idx], self.pad_id, self.autocast)
            rejected = sequence_logprobs(self.model, [self.pairs[j][1] for j in idx], self.pad_id, self.autocast)
            ref_c, ref_r = self.ref_c[idx], self.ref_r[idx]
            loss = self.loss_fn(chosen, rejected, ref_c, ref_r, self.beta).sum() / n
            loss.backward()
            total += loss.item()
            correct += int((((chosen - ref_c) - (rejected - ref_r)) > 0).sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": total, "rewards/accuracies": correct / n, "grad_norm": grad_norm.item()}

    @torch.no_grad()
    def accuracy(self) -> float:
        self.model.eval()
        c, r = self._score_all(self.model)
        return (((c - self.ref_c) - (r - self.ref_r)) > 0).float().mean().item()
