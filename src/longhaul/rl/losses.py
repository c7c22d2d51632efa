"""Policy losses, KL estimators and loss aggregation: pure tensor functions.

Shapes: `logp`, `old_logp`, `ref_logp`, `mask` are (B, T) over completion tokens;
`adv` is (B,) one scalar per sequence, or (B, T) one per token (GAE, turn-level). Per-token losses come back as (B, T) and are
reduced by `aggregate`, whose normalisers come from the *whole* batch so that gradient
accumulation over micro-batches gives exactly the full-batch update.
"""

from __future__ import annotations

import torch

from longhaul.rl.registry import Registry

POLICY_LOSSES = Registry("policy loss")
SEQUENCE_LOSSES = {"gspo"}  # a token's loss depends on its whole sequence (not splittable over context-parallel ranks)
KL_ESTIMATORS = Registry("KL estimator")


def _per_token(adv, like):
    """Sequence advantages (B,) broadcast over tokens, or per-token advantages (B, T) as they are."""
    return (adv[:, None] if adv.dim() == 1 else adv).expand_as(like)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logp, old_logp, adv, clip_low: float = 0.2, clip_high: float = 0.2, mask=None, **_):
    """PPO clipped surrogate with separate low/high epsilons (DAPO clip-higher).

    Returns (per-token loss (B, T), dict of (B, T) boolean masks: clipped low/high)."""
    ratio = torch.exp(logp - old_logp)
    a = _per_token(adv, logp)
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


def aggregate(per_token, mask, mode: str, total_tokens: float, total_seqs: float, max_len: int | None = None,
              row_tokens: torch.Tensor | None = None):
    """Reduce (B, T) per-token values to a scalar, normalised by whole-batch counts.

    token-mean: sum over all tokens / total_tokens.
    seq-mean-token-mean: each sequence's token mean, summed / total_seqs; the mean is over
    `row_tokens` (B,) tokens where given (a context-parallel rank's mask holds part of a row).
    seq-mean-token-sum: each sequence's token sum (over max_len if given, Dr. GRPO), summed / total_seqs.
    """
    masked = per_token * mask
    if mode == "token-mean":
        return masked.sum() / total_tokens
    if mode == "seq-mean-token-mean":
        count = mask.sum(-1) if row_tokens is None else row_tokens
        return (masked.sum(-1) / count.clamp(min=1)).sum() / total_seqs
    if mode == "seq-mean-token-sum":
        per_seq = masked.sum(-1) / (max_len if max_len else 1)
        return per_seq.sum() / total_seqs
    raise ValueError(f"unknown aggregation {mode!r}")


@POLICY_LOSSES.register("dual_clip")
def dual_clip(logp, old_logp, adv, clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float = 3.0, mask=None, **_):
    """PPO with dual clipping (Ye et al. 2020): for negative advantages the loss is also
    bounded by -c * A, so a huge ratio cannot blow up the update."""
    loss, info = ppo_clip(logp, old_logp, adv, clip_low, clip_high)
    a = _per_token(adv, loss)
    bounded = torch.minimum(loss, -clip_c * a)
    out = torch.where(a < 0, bounded, loss)
    with torch.no_grad():
        info = {**info, "dual": (a < 0) & (loss > -clip_c * a)}
    return out, info


@POLICY_LOSSES.register("gspo")
def gspo(logp, old_logp, adv, clip_low: float = 3e-4, clip_high: float = 4e-4, mask=None, **_):
    """GSPO (Zheng et al. 2025): one importance ratio per sequence, the geometric mean of the
    token ratios, clipped at the sequence level. Token-level form: s_i.detach() * pi/pi.detach()
    so every token of a sequence carries the same (sequence) ratio in value and gradient."""
    if mask is None:
        mask = torch.ones_like(logp)
    n = mask.sum(-1).clamp(min=1)
    log_s = ((logp - old_logp) * mask).sum(-1) / n  # (B,)
    s_tok = torch.exp(log_s.detach()[:, None] + logp - logp.detach())  # (B, T), value = s_i
    a = _per_token(adv, logp)
    loss = -torch.minimum(s_tok * a, torch.clamp(s_tok, 1 - clip_low, 1 + clip_high) * a)
    with torch.no_grad():
        s = torch.exp(log_s)[:, None].expand_as(loss)
        info = {"low": (s < 1 - clip_low) & (a < 0), "high": (s > 1 + clip_high) & (a > 0)}
    return loss, info


def entropy_bonus(entropy, coef: float):
    """Per-token loss term that rewards entropy: -coef * H."""
    return -coef * entropy


def truncated_is_weight(trainer_old_logp, behaviour_logp, cap: float = 2.0):
    """Truncated importance sampling between the trainer's old policy and the sampler that
    produced the tokens (off-policy or bf16-vs-fp32 mismatch): min(pi_old / mu, cap), no grad."""
    with torch.no_grad():
        return torch.clamp(torch.exp(trainer_old_logp - behaviour_logp), max=cap)


def off_policy_weight(kind: str, proximal_logp, behaviour_logp, cap: float | None):
    """Per-token weight (B, T) that corrects for tokens sampled by an older (or lower-precision)
    policy than the one the update starts from, or None for no correction. No grad.

    `tis`: truncated importance sampling, min(pi_prox / mu, cap); off when cap is None.
    `decoupled`: the decoupled PPO objective (Hilton et al. 2022; AReaL): the clipped ratio is
    taken against the proximal policy (the trainer's log-probs before this update) and each
    token's loss is weighted by pi_prox / mu; tokens whose weight exceeds `cap` are dropped
    (weight 0) rather than truncated, as AReaL does; no cap keeps every weight."""
    if kind == "tis":
        return None if cap is None else truncated_is_weight(proximal_logp, behaviour_logp, cap)
    if kind != "decoupled":
        raise ValueError(f"unknown off-policy correction {kind!r}; use tis or decoupled")
    with torch.no_grad():
        w = torch.exp(proximal_logp - behaviour_logp)
        return w if cap is None else w * (w <= cap)


def kl_reward_penalty(rewards, logp, ref_logp, mask, coef: float):
    """KL as a reward penalty (the InstructGPT/PPO form): per-token reward -coef * (logp - ref),
    with the sequence's outcome reward added at its last token. Returns (B, T) token rewards."""
    token_r = -coef * (logp - ref_logp) * mask
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)
    return token_r + last * rewards[:, None]


class AdaptiveKL:
    """Adaptive KL coefficient (Ziegler et al. 2019): nudge beta so the observed KL tracks a target."""

    def __init__(self, init: float, target: float, horizon: int = 10000):
        self.value, self.target, self.horizon = init, target, horizon

    def update(self, kl: float, n_steps: int) -> float:
        err = max(-0.2, min(0.2, kl / self.target - 1))
        self.value *= 1 + err * n_steps / self.horizon
        return self.value


def clipped_value_loss(values, old_values, returns, mask, clip: float = 0.2):
    """PPO's clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old +- eps) - R)^2), per token (B, T)."""
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (v_clip - returns) ** 2) * mask


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward: 0 up to max_len - buffer, then
    falling linearly to -penalty at max_len (and beyond)."""
    over = (lengths.float() - (max_len - buffer)).clamp(min=0) / max(1, buffer)
    return -penalty * over.clamp(max=1.0)
