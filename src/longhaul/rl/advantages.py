"""Advantage estimators for outcome rewards, as pure tensor functions registered by name.

All take `rewards` of shape (G, N): G prompt groups of N samples each, and return
advantages of the same shape, one scalar per sample (broadcast over its tokens by the loss).
"""

from __future__ import annotations

import torch

from longhaul.rl.registry import Registry

ADVANTAGES = Registry("advantage estimator")


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(r - group mean) / (group std + eps), std with Bessel's correction as in GRPO/TRL."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Dr. GRPO: r - group mean, no std scaling (removes the difficulty bias)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


@ADVANTAGES.register("rloo")
def rloo(rewards: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i - mean of the other N-1 rewards of the group."""
    n = rewards.shape[1]
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1)
    return rewards - others


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with a baseline: subtract the group mean, then whiten over the whole batch."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return (centred - centred.mean()) / (centred.std() + eps)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95):
    """Generalised advantage estimation over token steps.

    rewards, values, mask: (B, T). A sequence ends at its last masked-in token (the value after
    it is 0). Returns (advantages, returns), both (B, T), zero where mask is 0."""
    B, T = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(T)):
        m = mask[:, t]
        next_v = values[:, t + 1] * mask[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last * (mask[:, t + 1] if t + 1 < T else 0)) * m
        adv[:, t] = last
    return adv, (adv + values) * mask


ADVANTAGES["gae"] = gae
