"""A Bradley-Terry reward model: a causal LM backbone with a scalar head read at the last
token, trained on preference pairs with -log sigmoid(r_chosen - r_rejected). A trained model
is usable as a reward function `(completions, prompts=...) -> list[float]` (the RLHF path)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from longhaul.rl.logprobs import autocast_ctx, right_pad


class RewardModel(nn.Module):
    def __init__(self, lm, pad_id: int):
        super().__init__()
        self.backbone = lm.base_model
        self.head = nn.Linear(lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.bias)
        nn.init.normal_(self.head.weight, std=1.0 / lm.config.hidden_size ** 0.5)
        self.pad_id = pad_id

    def forward(self, seqs: list[list[int]], autocast: str = "none") -> torch.Tensor:
        """Token-id sequences -> rewards (B,)."""
        ids, attn = right_pad(seqs, self.pad_id)
        with autocast_ctx(autocast):
            hidden = self.backbone(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, L, H)
        last = hidden[torch.arange(len(seqs)), attn.sum(-1) - 1]  # (B, H)
        return self.head(last.float()).squeeze(-1)


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    return -F.logsigmoid(r_chosen - r_rejected)


class RewardTrainer:
    def __init__(self, rm: RewardModel, lr: float = 1e-4, micro_batch: int = 8):
        self.rm, self.micro_batch = rm, micro_batch
        self.optimizer = torch.optim.AdamW([p for p in rm.parameters() if p.requires_grad], lr=lr, foreach=False)

    def step(self, pairs: list[tuple[list[int], list[int]]]) -> dict:
        self.rm.train()
        n, total, correct = len(pairs), 0.0, 0
        for i in range(0, n, self.micro_batch):
            chunk = pairs[i:i + self.micro_batch]
            rc, rr = self.rm([c for c, _ in chunk]), self.rm([r for _, r in chunk])
            loss = bradley_terry_loss(rc, rr).sum() / n
            loss.backward()
            total += loss.item()
            correct += int((rc > rr).sum())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": total, "accuracy": correct / n}

    @torch.no_grad()
    def accuracy(self, pairs) -> float:
        self.rm.eval()
        rc, rr = self.rm([c for c, _ in pairs]), self.rm([r for _, r in pairs])
        return (rc > rr).float().mean().item()


def as_reward_function(rm: RewardModel, tok):
    """Wrap a reward model as a TRL-style reward function over plain-text completions."""
    @torch.no_grad()
    def reward(completions: list[str], prompts: list[str] | None = None, **_) -> list[float]:
        rm.eval()
        texts = [(p or "") + c for p, c in zip(prompts or [""] * len(completions), completions)]
        return rm([tok(t, add_special_tokens=False).input_ids or [tok.pad_token_id] for t in texts]).tolist()
    return reward
