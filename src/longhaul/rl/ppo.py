"""The PPO trainer: an actor, a learned critic (value model), GAE advantages, clipped policy
and value losses, several epochs of mini-batch updates on each rollout batch.

The RLHF form of PPO (Ziegler et al. 2019, InstructGPT) as TRL and verl run it, with these
deviations from the papers:
- the reward is the trajectory's outcome reward (a verifier score, not a reward model), put at
  the last model token of each training sequence (each segment of a multi-turn trajectory
  gets it); infra-error trajectories are dropped, neither scored nor trained on;
- with `kl_penalty="reward"` the per-token penalty -beta * (logp_old - logp_ref) is added to
  the token rewards (InstructGPT); with "loss" the KL estimator is a loss term as in GRPO;
  `kl_target` adapts beta once per step (Ziegler et al.), the estimator's token mean being the
  observed KL;
- the critic starts from the policy's own backbone (a full fp32 copy, even when the actor
  trains LoRA adapters) and a zero scalar head, not from a reward model;
- GAE runs over model tokens only: environment tokens between the turns of a multi-turn
  sequence are not time steps (no reward, no value loss, advantage 0);
- clip-higher (separate low/high epsilons, DAPO) and the truncated importance weight toward
  the sampler (`tis_cap`) are shared with GRPO;
- the learning-rate schedules advance once per trainer step (as TRL and verl), not once per
  mini-batch, so `warmup_steps` means the same as for GRPO.
GRPO's group options (`advantage`, `drop_zero_std_groups`, overlong shaping, `mask_truncated`,
`share_prompt`) do not apply: groups only shape the reward metrics. Rollouts are not here
(`longhaul.agent.rollout`), nor the loss and estimator functions (`losses`, `advantages`).
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.malloc import within_step
from longhaul.models.lora import is_lora
from longhaul.rl.advantages import gae
from longhaul.rl.grpo import padded_rows, frozen_copy
from longhaul.ops.autocast import autocast as autocast_ctx  # a name apart from the `autocast` arguments
from longhaul.rl.logprobs import completion_logprobs, pack
from longhaul.rl.losses import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveKL,
    aggregate,
    clipped_value_loss,
    entropy_bonus,
    kl_reward_penalty,
    off_policy_weight,
)
from longhaul.rl.optim import advance_schedule, clip_and_step, make_optimizer
from longhaul.types import Trajectory


def model_token_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95):
    """GAE over the mask-1 (model) tokens of each row only.

    rewards, values, mask: (B, T); mask 0 marks padding and environment tokens, which may sit
    between model tokens. Each row is compacted to its model tokens, `gae` runs on the compact
    rows, and the result is scattered back. Returns (advantages, returns), (B, T), 0 where mask is 0."""
    keep = mask > 0
    B = mask.shape[0]
    rows = torch.arange(B, device=mask.device)[:, None].expand_as(mask)[keep]
    cols = (keep.long().cumsum(-1) - 1)[keep]  # compact column of each model token
    width = int(keep.sum(-1).max()) if keep.any() else 0

    def compact(x):
        out = x.new_zeros(B, width)
        out[rows, cols] = x[keep].to(x.dtype)
        return out

    adv_c, ret_c = gae(compact(rewards), compact(values), compact(keep.to(rewards.dtype)), gamma, lam)
    adv, ret = torch.zeros_like(rewards), torch.zeros_like(rewards)
    adv[keep], ret[keep] = adv_c[rows, cols], ret_c[rows, cols]
    return adv, ret


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the mask-1 entries of the whole (B, T) batch; 0 where mask is 0."""
    vals = x[mask > 0]
    if vals.numel() < 2:
        return x * mask
    return (x - vals.mean()) / (vals.std() + eps) * mask


class ValueModel(nn.Module):
    """A critic: a full fp32 copy of the policy's transformer backbone plus a scalar head."""

    def __init__(self, policy):
        super().__init__()
        if is_lora(policy):  # merging a copy folds the adapters into plain, fully trainable weights
            backbone = copy.deepcopy(policy).merge_and_unload().base_model
        else:
            backbone = copy.deepcopy(policy.base_model)
        self.backbone = backbone.float().requires_grad_(True)
        self.head = nn.Linear(backbone.config.hidden_size, 1, device=next(backbone.parameters()).device)
        nn.init.zeros_(self.head.weight)  # V = 0 at the start: no made-up baseline
        nn.init.zeros_(self.head.bias)

    def values(self, pairs: list[tuple[list[int], list[int]]], pad_id: int, autocast: str = "none"):
        """Value (B, T) of the state before each completion token (read where `completion_logprobs`
        reads the logits: position len(prompt) - 1 + t), 0 past each row's end, and the mask (B, T)."""
        ids, attn, index, _, mask = pack(pairs, pad_id)
        device = self.head.weight.device
        ids, attn, index, mask = (x.to(device) for x in (ids, attn, index, mask))
        with autocast_ctx(autocast):
            hidden = self.backbone(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, L, H)
        picked = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, T, H)
        return self.head(picked.float()).squeeze(-1) * mask, mask


@dataclass
class Experience:
    """One rollout batch with everything the updates need, computed once under no_grad.
    Tensors are (N, T) over the N training sequences, T their longest completion."""
    pairs: list[tuple[list[int], list[int]]]
    outcome: torch.Tensor  # (N,) the trajectory's reward
    mask: torch.Tensor  # 1 on model tokens; 0 on environment tokens and padding
    behaviour: torch.Tensor  # the sampler's log-probs
    old_logp: torch.Tensor  # the actor before this step's updates
    ref_logp: torch.Tensor | None  # the frozen reference, when kl_coef > 0
    values: torch.Tensor  # the critic before this step's updates
    token_rewards: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


class _Hold:
    """Stands in for a scheduler inside a step: the schedule advances once per trainer step."""

    def step(self) -> None:
        pass


class PPOTrainer:
    def __init__(self, policy, pad_id: int, algo: AlgoConfig, train: TrainConfig, temperature: float = 1.0, max_new_tokens: int = 128):
        self.policy, self.pad_id, self.algo, self.train_cfg, self.temperature = policy, pad_id, algo, train, temperature
        self.max_new_tokens = max_new_tokens
        self.loss_fn = POLICY_LOSSES.get_fn(algo.loss)
        self.kl_fn = KL_ESTIMATORS.get_fn(algo.kl_estimator)
        self.ref = frozen_copy(policy) if algo.kl_coef > 0 else None  # kl_coef 0: no reference at all
        self.adaptive_kl = AdaptiveKL(algo.kl_coef, algo.kl_target) if algo.kl_target and self.ref is not None else None
        self.critic = ValueModel(policy)
        self.optimizer, self.scheduler = make_optimizer(policy.parameters(), train)
        self.critic_optimizer, self.critic_scheduler = make_optimizer(self.critic.parameters(), train, lr=algo.critic_lr)
        self.steps = 0  # seeds the mini-batch shuffle, so a resumed run shuffles as an unbroken one

    @property
    def kl_coef(self) -> float:
        return self.adaptive_kl.value if self.adaptive_kl else self.algo.kl_coef

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "critic": self.critic.state_dict(), "critic_optimizer": self.critic_optimizer.state_dict(),
                "critic_scheduler": self.critic_scheduler.state_dict(), "kl_coef": self.kl_coef, "ppo_steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.critic.load_state_dict(state["critic"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        if self.adaptive_kl:
            self.adaptive_kl.value = state["kl_coef"]
        self.steps = state["ppo_steps"]

    def _chunks(self, pairs, idx: list[int]) -> list[list[int]]:
        """Micro-batches of similar length; the normalisers are mini-batch totals, so any split
        accumulates the same gradient."""
        order = sorted(idx, key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        mb = self.train_cfg.micro_batch
        return [order[i:i + mb] for i in range(0, len(order), mb)]

    @torch.no_grad()
    def make_experience(self, groups: list[list[Trajectory]]) -> Experience | None:
        """Old actor and reference log-probs, old values, token rewards, advantages and returns
        for the sequences of `groups`; None when no trajectory is left to train on."""
        seqs, outcome = [], []
        for g in groups:
            for t in g:
                if t.info.get("ended") == "infra_error" or not t.turns:
                    continue
                for s in t.sequences():
                    seqs.append(s)
                    outcome.append(t.reward)
        if not seqs:
            return None
        device = next(self.policy.parameters()).device
        pairs = [(s.prompt_ids, s.completion_ids) for s in seqs]
        shape = torch.zeros(len(seqs), max(len(c) for _, c in pairs), device=device)  # (N, T)
        mask = padded_rows([s.loss_mask for s in seqs], shape)
        old, val = shape.clone(), shape.clone()
        ref = shape.clone() if self.ref is not None else None
        ac = self.train_cfg.autocast
        for idx in self._chunks(pairs, list(range(len(pairs)))):
            sub = [pairs[i] for i in idx]
            lp = completion_logprobs(self.policy, sub, self.pad_id, self.temperature, ac)[0]
            old[idx, : lp.shape[1]] = lp
            val[idx, : lp.shape[1]] = self.critic.values(sub, self.pad_id, ac)[0]
            if ref is not None:
                ref[idx, : lp.shape[1]] = completion_logprobs(self.ref, sub, self.pad_id, self.temperature, ac)[0]
        outcome = torch.tensor(outcome, dtype=torch.float32, device=device)
        in_reward = ref is not None and self.algo.kl_penalty == "reward"
        # with a coefficient of 0 this is the outcome at the last model token alone
        rewards = kl_reward_penalty(outcome, old, ref if in_reward else old, mask, self.kl_coef if in_reward else 0.0)
        val = val * mask
        adv, ret = model_token_gae(rewards, val, mask, self.algo.gamma, self.algo.lam)
        if self.algo.whiten_advantages:
            adv = whiten(adv, mask)
        return Experience(pairs, outcome, mask, padded_rows([s.logprobs for s in seqs], shape), old, ref, val, rewards, adv, ret)

    def _update(self, exp: Experience, idx: list[int], sums: dict) -> None:
        """One actor and one critic optimizer step on the mini-batch `idx`, micro-batched."""
        a, ac = self.algo, self.train_cfg.autocast
        n_tok = max(exp.mask[idx].sum().item(), 1.0)
        n_seq, max_len = float(len(idx)), max(len(exp.pairs[i][1]) for i in idx)
        actor_loss = value_loss = t_critic = 0.0
        for c in self._chunks(exp.pairs, idx):
            sub = [exp.pairs[i] for i in c]
            logp, mask, ent = completion_logprobs(self.policy, sub, self.pad_id, self.temperature, ac, True, a.entropy_coef > 0)
            T = logp.shape[1]
            mask = mask * exp.mask[c, :T]
            old, adv = exp.old_logp[c, :T], exp.advantages[c, :T]
            tok_loss, clip = self.loss_fn(logp, old, adv, clip_low=a.clip_low, clip_high=a.clip_high, clip_c=a.dual_clip_c, mask=mask)
            if (w := off_policy_weight(a.off_policy, old, exp.behaviour[c, :T], a.tis_cap)) is not None:
                tok_loss = tok_loss * w
            ent = ent * mask
            if a.entropy_coef > 0:
                tok_loss = tok_loss + entropy_bonus(ent, a.entropy_coef)
                ent = ent.detach()
            if exp.ref_logp is not None and a.kl_penalty == "loss":
                tok_loss = tok_loss + self.kl_coef * self.kl_fn(logp, exp.ref_logp[c, :T])
            loss = aggregate(tok_loss, mask, a.aggregation, n_tok, n_seq, max_len)
            loss.backward()
            actor_loss += loss.item()
            sums["entropy"] += ent.sum().item()
            sums["low"] += (clip["low"] * mask).sum().item()
            sums["high"] += (clip["high"] * mask).sum().item()

            t1 = time.perf_counter()
            v = self.critic.values(sub, self.pad_id, ac)[0]
            old_v, ret = exp.values[c, :T], exp.returns[c, :T]
            vl = aggregate(clipped_value_loss(v, old_v, ret, mask, a.value_clip), mask, a.aggregation, n_tok, n_seq, max_len)
            (a.vf_coef * vl).backward()
            within_step()  # bound the kept heap between micro-batches (`malloc.within_step`)
            value_loss += vl.item()
            with torch.no_grad():  # verl's vf_clipfrac: tokens where the clipped branch is the larger loss
                v_clip = old_v + (v - old_v).clamp(-a.value_clip, a.value_clip)
                sums["vf_clip"] += (((v_clip - ret) ** 2 > (v - ret) ** 2) * mask).sum().item()
            t_critic += time.perf_counter() - t1
        sums["grad_norm"] += clip_and_step(self.policy.parameters(), self.optimizer, _Hold(), self.train_cfg.grad_clip, actor_loss)
        t1 = time.perf_counter()
        sums["critic_grad_norm"] += clip_and_step(self.critic.parameters(), self.critic_optimizer, _Hold(), self.train_cfg.grad_clip, value_loss)
        sums["t_critic"] += t_critic + time.perf_counter() - t1
        sums["loss"] += actor_loss
        sums["value_loss"] += value_loss
        sums["updates"] += 1

    def step(self, groups: list[list[Trajectory]]) -> dict:
        """Rollout statistics once, then `ppo_epochs` passes of `mini_batches` updates of actor
        and critic; returns TRL/verl-named metrics."""
        t0 = time.perf_counter()
        m = {**_reward_metrics(groups), "lr": self.scheduler.get_last_lr()[0],
             "critic/lr": self.critic_scheduler.get_last_lr()[0], "kl_coef": self.kl_coef}
        exp = self.make_experience(groups)
        t_ref = time.perf_counter() - t0
        if exp is None:
            self._advance()
            return {**m, **_EMPTY, "timing/ref": t_ref}
        self.policy.train()
        self.critic.train()
        sums: dict = defaultdict(float)
        shuffle = torch.Generator().manual_seed(self.steps)
        N = len(exp.pairs)
        for _ in range(self.algo.ppo_epochs):
            for mb in torch.randperm(N, generator=shuffle).tensor_split(min(self.algo.mini_batches, N)):
                self._update(exp, mb.tolist(), sums)
        n_tok = max(exp.mask.sum().item(), 1.0)
        kl = (self.kl_fn(exp.old_logp, exp.ref_logp) * exp.mask).sum().item() / n_tok if exp.ref_logp is not None else 0.0
        if self.adaptive_kl:
            self.adaptive_kl.update(kl, N)
        self._advance()
        passes, u = n_tok * self.algo.ppo_epochs, sums["updates"]
        m.update({
            "kl": kl, "entropy": sums["entropy"] / passes, "loss": sums["loss"] / u, "grad_norm": sums["grad_norm"] / u,
            "clip_ratio/low_mean": sums["low"] / passes, "clip_ratio/high_mean": sums["high"] / passes,
            "clip_ratio/region_mean": (sums["low"] + sums["high"]) / passes,
            "logprob_gap": ((exp.old_logp - exp.behaviour).abs() * exp.mask).sum().item() / n_tok,
            "num_tokens": int(n_tok), "num_trained_seqs": N,
            **_critic_metrics(exp), "critic/value_loss": sums["value_loss"] / u, "critic/vf_clipfrac": sums["vf_clip"] / passes,
            "critic/grad_norm": sums["critic_grad_norm"] / u,
            "timing/ref": t_ref, "timing/update_critic": sums["t_critic"],
            "timing/update_actor": time.perf_counter() - t0 - t_ref - sums["t_critic"],
        })
        return m

    def _advance(self) -> None:
        advance_schedule(self.scheduler)
        advance_schedule(self.critic_scheduler)
        self.steps += 1


_EMPTY = {"kl": 0.0, "entropy": float("nan"), "loss": 0.0, "grad_norm": 0.0, "clip_ratio/low_mean": 0.0,
          "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0, "logprob_gap": float("nan"), "num_tokens": 0,
          "num_trained_seqs": 0, "critic/values_mean": float("nan"), "critic/returns_mean": float("nan"),
          "critic/advantages_mean": float("nan"), "critic/explained_variance": float("nan"), "critic/value_loss": 0.0,
          "critic/vf_clipfrac": 0.0, "critic/grad_norm": 0.0, "timing/update_critic": 0.0, "timing/update_actor": 0.0}


def _reward_metrics(groups: list[list[Trajectory]]) -> dict:
    """reward, reward_std (mean in-group std) and frac_reward_zero_std over non-infra trajectories."""
    kept = [[t.reward for t in g if t.info.get("ended") != "infra_error"] for g in groups]
    flat = [r for g in kept for r in g]
    stds = [torch.tensor(g).std().item() if len(g) > 1 else 0.0 for g in kept]
    return {"reward": sum(flat) / len(flat) if flat else 0.0, "reward_std": sum(stds) / len(stds) if stds else 0.0,
            "frac_reward_zero_std": sum(s == 0 for s in stds) / len(stds) if stds else 0.0}


def _critic_metrics(exp: Experience) -> dict:
    """The rollout's values, returns and advantages over model tokens, and how much of the
    returns' variance the values explain (1 is perfect, <= 0 no better than a constant)."""
    keep = exp.mask > 0
    v, r = exp.values[keep], exp.returns[keep]
    ev = 1 - (r - v).var() / r.var() if r.numel() > 1 and r.var() > 0 else torch.tensor(float("nan"))
    return {"critic/values_mean": v.mean().item(), "critic/returns_mean": r.mean().item(),
            "critic/advantages_mean": exp.advantages[keep].mean().item(), "critic/explained_variance": ev.item()}
