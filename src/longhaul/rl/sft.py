"""Supervised fine-tuning: next-token loss on assistant tokens only.

The loss is the sum of token losses over the whole batch divided by the batch's count of
loss tokens, so micro-batch accumulation gives exactly the full-batch gradient. Sequences
are padded, not packed (packing across examples would let attention cross them).
"""

from __future__ import annotations

import torch

from longhaul.rl.logprobs import autocast_ctx, right_pad


def masked_logprobs(model, seqs: list[tuple[list[int], list[int]]], pad_id: int, autocast: str = "none"):
    """Per-token log-probs (B, L-1) of ids[1:] given the prefix, and the loss mask (B, L-1)."""
    ids, attn = right_pad([x for x, _ in seqs], pad_id)
    mask = torch.zeros(ids.shape, dtype=torch.float32)
    for b, (_, m) in enumerate(seqs):
        mask[b, : len(m)] = torch.tensor(m, dtype=torch.float32)
    with autocast_ctx(autocast):
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    logits = logits.float()
    logp = (logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)) * mask[:, 1:]
    return logp, mask[:, 1:]


class SFTTrainer:
    def __init__(self, model, pad_id: int, lr: float = 1e-4, micro_batch: int = 8, grad_clip: float = 1.0, autocast: str = "none"):
        self.model, self.pad_id, self.micro_batch, self.grad_clip, self.autocast = model, pad_id, micro_batch, grad_clip, autocast
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, foreach=False)

    def step(self, batch: list[tuple[list[int], list[int]]]) -> dict:
        n_tok = float(sum(sum(m[1:]) for _, m in batch))
        if n_tok == 0:
            raise ValueError("batch has no loss tokens (no assistant content)")
        self.model.train()
        total = 0.0
        for i in range(0, len(batch), self.micro_batch):
            logp, mask = masked_logprobs(self.model, batch[i:i + self.micro_batch], self.pad_id, self.autocast)
            loss = -(logp * mask).sum() / n_tok
            loss.backward()
            total += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": total, "grad_norm": grad_norm.item(), "num_tokens": int(n_tok)}
