"""Policy losses, KL estimators and loss aggregation: pure tensor functions.

Shapes: `logp`, `old_logp`, `ref_logp`, `mask` are (B, T) over completion tokens;
`adv` is (B,) one scalar per sequence. Per-token losses come back as (B, T) and are
reduced by `aggregate`, whose normalisers come from the *whole* batch so that gradient
accumulation over micro-batches gives exactly the full-batch update.
"""

from __future__ import annotations

import torch

from longhaul.rl.registry import Registry

POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logp, old_logp, adv, clip_low: float = 0.2, clip_high: float = 0.2):
    """PPO clipped surrogate with separate low/high epsilons (DAPO clip-higher).

    Returns (per-token loss (B, T), dict of (B, T) boolean masks: clipped low/high)."""
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * a
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        low = (ratio < 1 - clip_low) & (a < 0)
        high = (ratio > 1 + clip_high) & (a > 0)
    return loss, {"low": low, "high": high}


@KL_ESTIMATORS.register("k1")
def kl_k1(logp, ref_logp):
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp, ref_logp):
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp, ref_logp):
    """Schulman's unbiased, always-positive estimator: exp(ref - logp) - (ref - logp) - 1."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def aggregate(per_token, mask, mode: str, total_tokens: float, total_seqs: float, max_len: int | None = None):
    """Reduce (B, T) per-token values to a scalar, normalised by whole-batch counts.

    token-mean: sum over all tokens / total_tokens.
    seq-mean-token-mean: each sequence's token mean, summed / total_seqs.
    seq-mean-token-sum: each sequence's token sum (over max_len if given, Dr. GRPO), summed / total_seqs.
    """
    masked = per_token * mask
    if mode == "token-mean":
        return masked.sum() / total_tokens
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / total_seqs
    if mode == "seq-mean-token-sum":
        per_seq = masked.sum(-1) / (max_len if max_len else 1)
        return per_seq.sum() / total_seqs
    raise ValueError(f"unknown aggregation {mode!r}")
