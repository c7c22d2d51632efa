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


def turn_level(turn_rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Turn-level advantages for multi-turn episodes of different lengths.

    turn_rewards, turn_mask: (G, N, K): G groups of N episodes, up to K turns; the episode's
    outcome reward is added to its last turn's reward by the caller; mask 1 where the episode
    has that turn. The advantage of turn k is its discounted return-to-go minus a leave-one-out
    baseline: the mean return-to-go at the same turn index over the *other* episodes of the
    group that reached turn k (or, when none did, the mean full return of the others).

    Why unbiased: the baseline of episode n is built only from the other, independently sampled
    episodes, so it cannot depend on n's actions, and E[grad log pi * baseline] = 0 however many
    turns each episode has. (A group-mean baseline that includes n itself, or one pooled over all
    turns of all episodes, correlates with n's own return and biases long episodes.)
    Returns (G, N, K), 0 where the mask is 0."""
    G, N, K = turn_rewards.shape
    if N < 2:
        raise ValueError("turn-level advantages need at least 2 episodes per group for a leave-one-out baseline")
    r = turn_rewards * turn_mask
    ret = torch.zeros_like(r)
    running = torch.zeros_like(r[..., 0])
    for k in reversed(range(K)):
        running = r[..., k] + gamma * running * turn_mask[..., k + 1] if k + 1 < K else r[..., k]
        ret[..., k] = running
    ret = ret * turn_mask
    count = turn_mask.sum(1, keepdim=True) - turn_mask  # (G, N, K) others that reached turn k
    others = (ret.sum(1, keepdim=True) - ret) / count.clamp(min=1)
    full = ret[..., :1]  # (G, N, 1) every episode has turn 0
    fallback = (full.sum(1, keepdim=True) - full) / (N - 1)
    baseline = torch.where(count > 0, others, fallback.expand_as(others))
    return (ret - baseline) * turn_mask


turn_level.per_turn = True  # the trainer feeds it per-turn rewards, not one reward per episode
ADVANTAGES["turn_level"] = turn_level
