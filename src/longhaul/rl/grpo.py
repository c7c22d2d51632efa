"""The GRPO trainer: group-normalised advantages, clipped policy loss, KL to a frozen
reference, gradient clipping, AdamW.

Deviations from the GRPO paper, all configurable: clip-higher (separate low/high epsilons,
from DAPO); groups whose rewards are all equal are skipped (they carry no policy gradient,
as in DAPO's dynamic sampling, minus the refill); one optimizer step per batch, so the
"old" policy is the current one and its log-probs are recomputed in the same forward
(`ratio` is 1 at the start of the step). The estimator, loss and KL estimator are looked
up by name in `advantages` / `losses`.
"""

from __future__ import annotations

import contextlib
import copy
import time

import torch

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.errors import LonghaulError
from longhaul.malloc import within_step
from longhaul.rl import packed_forward
from longhaul.rl.advantages import ADVANTAGES
from longhaul.rl.logprobs import (
    completion_logprobs,
    packed_logprobs,
    shared_prompt_logprobs,
)
from longhaul.rl.losses import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    SEQUENCE_LOSSES,
    aggregate,
    entropy_bonus,
    off_policy_weight,
    overlong_penalty,
)
from longhaul.rl.optim import OptimizerState, advance_schedule, clip_and_step, make_optimizer
from longhaul.rl.rollout_activations import RolloutActivations
from longhaul.types import Trajectory


def frozen_copy(model, dtype: torch.dtype | None = None):
    ref = copy.deepcopy(model)
    if dtype is not None:
        ref.to(dtype)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def padded_rows(rows: list[list[float]], like: torch.Tensor) -> torch.Tensor:
    """Behaviour log-probs as a (B, T) tensor shaped like `like` (zeros past each row's end)."""
    out = torch.zeros_like(like)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r, dtype=like.dtype)
    return out


def _turn_rewards(groups: list[list[Trajectory]], rewards: torch.Tensor, infra: list[list[bool]]):
    """Per-turn rewards (G, N, K) with each episode's outcome reward added at its last turn, and
    the turn mask. An infra-error episode counts as one turn carrying its replaced reward."""
    G, N = rewards.shape
    K = max(max(1, len(t.turns)) for g in groups for t in g)
    r, m = torch.zeros(G, N, K), torch.zeros(G, N, K)
    for i, g in enumerate(groups):
        for j, t in enumerate(g):
            n = 1 if infra[i][j] or not t.turns else len(t.turns)
            m[i, j, :n] = 1
            if n > 1 or (t.turns and not infra[i][j]):
                r[i, j, :n] = torch.tensor([turn.reward for turn in t.turns[:n]])
            r[i, j, n - 1] += rewards[i, j]
    return r, m


def _weigh_negatives(adv: torch.Tensor, weight: float) -> torch.Tensor:
    """Advantages with the negative ones scaled by `weight` (`algo.negative_weight`)."""
    return adv if weight == 1.0 else torch.where(adv < 0, adv * weight, adv)


def check_context(algo: AlgoConfig) -> None:
    """One-line errors for a GRPO run that cannot split its rows over a context-parallel group
    (the model's part: `context_parallel.packed.check_model`)."""
    if algo.loss in SEQUENCE_LOSSES:
        raise LonghaulError(f"algo.loss={algo.loss} weighs each token by its whole sequence's ratio, which a context-parallel "
                            f"rank does not hold; set train.context_parallel=1 or a token-level loss (ppo_clip, dual_clip)")


class GRPOTrainer(OptimizerState):
    def __init__(self, policy, pad_id: int, algo: AlgoConfig, train: TrainConfig, temperature: float = 1.0, max_new_tokens: int = 128,
                 dp=None, context=None):
        """dp: a `distributed.DataParallel` when this is one rank of data-parallel training: `step`
        then gets this rank's groups, counts and metrics are summed over ranks, and the policy's
        training forward and gradients go through dp's DDP or FSDP2 wrapper.

        context: a `context_parallel.packed.ContextGroup` when this is one rank of context-parallel
        training: every rank of the group gets the same groups (all of them, or with data-parallel
        replicas of the group its replica's share, the counts then summed over replicas), and each
        micro-batch's (prompt, completion) rows are packed into one flat row (with `share_prompt`,
        the group's prompt once) split over the group (`ContextGroup.shard`). A rank's log-probs
        cover the completion tokens its rows predict; the loss, its normalisers and the
        per-sequence token counts are the whole batch's, so the ranks' losses sum to one
        process's, and so do their gradients (`reduce_gradients`) and the metrics' sums. Not both: a context group's replicas sum their gradients themselves."""
        self.policy, self.pad_id, self.algo, self.train_cfg, self.temperature = policy, pad_id, algo, train, temperature
        self.max_new_tokens, self.dp, self.context = max_new_tokens, dp, context
        if context is not None:
            if dp is not None:
                raise ValueError("GRPOTrainer: a context group's data-parallel replicas are its own (ContextGroup.data), not dp")
            check_context(algo)
            context.check(policy)
        self.advantage_fn = ADVANTAGES.get_fn(algo.advantage)
        self.loss_fn = POLICY_LOSSES.get_fn(algo.loss)
        self.kl_fn = KL_ESTIMATORS.get_fn(algo.kl_estimator)
        # With kl_coef 0 no reference model is built at all (saves its memory and forward).
        self.ref = frozen_copy(policy) if algo.kl_coef > 0 else None
        if dp is not None:
            dp.wrap(policy)  # before the optimizer: FSDP2's optimizer steps the sharded parameters
        self.params = list(policy.parameters() if dp is None else dp.parameters())
        self.optimizer, self.scheduler = make_optimizer(self.params, train)

    def state_dict(self) -> dict:
        if self.dp is None:
            return super().state_dict()
        return {"optimizer": self.dp.optimizer_state_dict(self.optimizer), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.dp is None:
            return super().load_state_dict(state)
        self.dp.load_optimizer_state_dict(self.optimizer, state["optimizer"], self.policy)
        self.scheduler.load_state_dict(state["scheduler"])

    def _total(self, values: list[float]) -> list[float]:
        """Counts of this rank's groups summed over data-parallel ranks (or context replicas)."""
        if self.context is not None:
            return self.context.total(values)
        return values if self.dp is None else self.dp.sum(values)

    def select(self, groups: list[list[Trajectory]]):
        """Rewards, their group std, and the training sequences with their advantages.

        A trajectory that ended in an infra error is neither scored nor trained on: its reward is
        replaced by its group's mean of the others (the group mean stays put) and it is dropped. A
        multi-turn trajectory contributes one sequence per segment, each with its advantage."""
        if not groups:  # a data-parallel rank's empty shard (fewer groups than ranks)
            return torch.zeros(0, 0), torch.zeros(0), [], [], []
        infra = [[t.info.get("ended") == "infra_error" for t in g] for g in groups]
        rewards = torch.tensor([[t.reward for t in g] for g in groups], dtype=torch.float32)  # (G, N)
        for i, flags in enumerate(infra):
            ok = [r for r, bad in zip(rewards[i].tolist(), flags) if not bad]
            for j, bad in enumerate(flags):
                if bad:
                    rewards[i, j] = sum(ok) / len(ok) if ok else 0.0
        if self.algo.overlong_buffer:
            lengths = torch.tensor([[t.completion_len for t in g] for g in groups])
            rewards = rewards + overlong_penalty(lengths, self.max_new_tokens, self.algo.overlong_buffer, self.algo.overlong_penalty)
        if getattr(self.advantage_fn, "per_turn", False):
            turn_r, turn_m = _turn_rewards(groups, rewards, infra)
            per_turn = _weigh_negatives(self.advantage_fn(turn_r, turn_m, gamma=self.algo.gamma), self.algo.negative_weight)  # (G, N, K)
            std = turn_r.sum(-1).std(dim=1)
            token_adv = lambda i, j, s: [per_turn[i, j, k].item() for k in s.turn_index]
        else:
            adv = _weigh_negatives(self.advantage_fn(rewards), self.algo.negative_weight)
            std = rewards.std(dim=1)
            token_adv = lambda i, j, s: [adv[i, j].item()] * len(s.completion_ids)
        keep = [i for i in range(len(groups)) if not (self.algo.drop_zero_std_groups and std[i] == 0)]
        seqs, advs, sizes = [], [], []
        for i in keep:
            n = 0
            for j, t in enumerate(groups[i]):
                if infra[i][j] or not t.turns:
                    continue
                truncated = t.turns[-1].finish_reason == "length" or t.info.get("ended") == "truncated"
                if self.algo.mask_truncated and truncated:
                    continue
                for s in t.sequences():
                    seqs.append(s)
                    advs.append(token_adv(i, j, s))
                    n += 1
            if n:
                sizes.append(n)
        return rewards, std, seqs, advs, sizes

    def _units(self, pairs, sizes: list[int]) -> list[list[int]]:
        """Index lists for one forward/backward each. With `share_prompt`, a unit is (part of)
        one group, whose prompt is then computed once; else micro-batches of similar length."""
        mb = self.train_cfg.micro_batch
        if self.train_cfg.share_prompt:
            units, start = [], 0
            for size in sizes:
                units += [list(range(i, min(i + mb, start + size))) for i in range(start, start + size, mb)]
                start += size
            return units
        # similar lengths waste less compute on padding; normalisers are whole-batch counts,
        # so the accumulated gradient is the full-batch gradient either way
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        return [order[i:i + mb] for i in range(0, len(order), mb)]

    def reuse_rollout_forward(self, engine) -> bool:
        """Record `engine`'s forwards and, in steps on its rollouts while it holds exactly the
        policy's weights, use them as the policy's training forward (`rl.rollout_activations`:
        same maths, the forward's matmuls skipped). True if the engine qualifies (fp32, plain)."""
        ok = self.train_cfg.autocast == "none" and packed_forward.supports(self.policy) and not self.algo.entropy_coef \
            and self.context is None  # the recorded rows are whole rows, not a rank's shard
        self.rollout = RolloutActivations.attach(engine) if ok else None
        self._rollout_ok = (-1, False)
        return self.rollout is not None

    def _recorded(self, pairs, idx: list[int]):
        """The rollout's recorded forward for these sequences, or None (then the forward runs)."""
        if getattr(self, "rollout", None) is None:
            return None
        if self._rollout_ok[0] != self.scheduler.last_epoch:  # checked once an optimizer step
            self._rollout_ok = (self.scheduler.last_epoch, self.rollout.usable(self.policy))
            if not self._rollout_ok[1]:
                self.rollout.clear()  # recorded under other weights: never usable
        if not self._rollout_ok[1]:
            return None
        return self.rollout.batch([pairs[i][0] for i in idx], [pairs[i][1] for i in idx], self.pad_id, self.train_cfg.share_prompt)

    def _logprobs(self, model, pairs, idx: list[int], with_entropy: bool = False, entropy_grad: bool = False):
        ac = self.train_cfg.autocast
        recorded = self._recorded(pairs, idx) if model is self.policy else None
        if recorded is not None:
            self.recorded_units = getattr(self, "recorded_units", 0) + 1
            return packed_logprobs(model, recorded[0], self.temperature, ac, with_entropy, entropy_grad, recorded[1])
        if self.context is not None:  # a unit's rows end to end (a shared prompt once), split over the group
            if self.train_cfg.share_prompt:
                packed = packed_forward.pack_shared(pairs[idx[0]][0], [pairs[i][1] for i in idx], self.pad_id)
            else:
                packed = packed_forward.pack_pairs([pairs[i] for i in idx], self.pad_id)
            return packed_logprobs(model, self.context.shard(packed), self.temperature, ac, with_entropy, entropy_grad)
        if self.train_cfg.share_prompt:
            return shared_prompt_logprobs(model, pairs[idx[0]][0], [pairs[i][1] for i in idx], self.pad_id,
                                          self.temperature, ac, with_entropy, entropy_grad, fast=True)
        return completion_logprobs(model, [pairs[i] for i in idx], self.pad_id, self.temperature, ac, with_entropy, entropy_grad,
                                   fast=True)  # the packed forward and fused head (`logprobs`), equal to HF's to rounding

    def _policy_logprobs(self, pairs, idx: list[int]):
        """The policy's training forward; under data parallel through dp's wrapper, whose hooks sync its gradients."""
        entropy_grad = self.algo.entropy_coef > 0
        if self.dp is None:
            return self._logprobs(self.policy, pairs, idx, True, entropy_grad)
        return self.dp.forward(self._logprobs, pairs, idx, True, entropy_grad)

    def _accumulating(self, last: bool):
        """Every micro-batch's backward but the last only accumulates: data parallel syncs once a step."""
        return contextlib.nullcontext() if self.dp is None or last else self.dp.accumulate()

    def step(self, groups: list[list[Trajectory]]) -> dict:
        """One optimizer step on a batch of prompt groups; returns TRL/verl-named metrics."""
        t0 = time.perf_counter()
        rewards, std, seqs, advs, sizes = self.select(groups)
        env_masks = [s.loss_mask for s in seqs]  # 0 on tool/environment tokens of multi-turn sequences
        # batch-wide counts (summed over data-parallel ranks): every normaliser is the whole batch's
        n_tok, n_seq, r_sum, r_n, std_sum, zero_std, n_groups = self._total(
            [float(sum(sum(x) for x in env_masks)), float(len(seqs)), rewards.sum().item(), float(rewards.numel()),
             std.sum().item(), (std == 0).sum().item(), float(len(groups))])
        m = {
            "reward": r_sum / r_n,
            "reward_std": std_sum / n_groups,
            "frac_reward_zero_std": zero_std / n_groups,
            "num_trained_seqs": int(n_seq),
            "lr": self.scheduler.get_last_lr()[0],
        }
        zeros = {"kl": 0.0, "entropy": float("nan"), "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
                 "clip_ratio/region_mean": 0.0, "grad_norm": 0.0, "loss": 0.0, "logprob_gap": float("nan"),
                 "timing/ref": 0.0, "num_tokens": 0}
        if not n_seq:
            advance_schedule(self.scheduler)
            return {**m, **zeros, "timing/update_actor": time.perf_counter() - t0}
        pairs = [(s.prompt_ids, s.completion_ids) for s in seqs]
        behaviour = [s.logprobs for s in seqs]
        # Dr. GRPO's constant normaliser: the generation budget, not this batch's longest (multi-turn can exceed it)
        max_len = max(self.max_new_tokens, max((len(c) for _, c in pairs), default=0))
        if self.dp is not None:
            max_len = int(self.dp.max(max_len))
        elif self.context is not None:
            max_len = int(self.context.maximum(max_len))
        chunks = self._units(pairs, sizes)  # none on a rank whose groups all had equal rewards

        ref_logps, t_ref = [], time.perf_counter()
        if self.ref is not None:
            with torch.no_grad():
                for idx in chunks:
                    ref_logps.append(self._logprobs(self.ref, pairs, idx)[0])
        t_ref = time.perf_counter() - t_ref

        (self.policy if self.dp is None else self.dp.module).train()
        sums = {"kl": 0.0, "entropy": 0.0, "low": 0.0, "high": 0.0, "loss": 0.0, "gap": 0.0}
        for k, idx in enumerate(chunks):
            with self._accumulating(last=k == len(chunks) - 1):
                logp, mask, ent = self._policy_logprobs(pairs, idx)
                env = padded_rows([env_masks[i] for i in idx], mask)
                mask = mask * env
                # each sequence's token count for a per-sequence mean: the whole row's, also where
                # this context-parallel rank holds only part of it
                row_tokens = env.sum(-1) if self.context is not None else None
                ent = ent * mask
                old = logp.detach()  # single update per batch: the old policy is the current one
                beh = padded_rows([behaviour[i] for i in idx], old)  # the sampler's log-probs, (B, T)
                beh = torch.where(beh.isnan(), old, beh)  # no sampler (a guidance demonstration): on-policy
                tok_loss, clip = self.loss_fn(logp, old, padded_rows([advs[i] for i in idx], old), clip_low=self.algo.clip_low, clip_high=self.algo.clip_high,
                                              clip_c=self.algo.dual_clip_c, mask=mask)
                if (w := off_policy_weight(self.algo.off_policy, old, beh, self.algo.tis_cap)) is not None:
                    tok_loss = tok_loss * w
                if self.algo.entropy_coef > 0:
                    tok_loss = tok_loss + entropy_bonus(ent, self.algo.entropy_coef)
                    ent = ent.detach()
                if self.ref is not None:
                    kl_tok = self.kl_fn(logp, ref_logps[k])
                    tok_loss = tok_loss + self.algo.kl_coef * kl_tok
                    sums["kl"] += (kl_tok.detach() * mask).sum().item()
                loss = aggregate(tok_loss, mask, self.algo.aggregation, n_tok, n_seq, max_len, row_tokens)
                loss.backward()
                within_step()  # bound the kept heap between micro-batches (`malloc.within_step`)
                sums["loss"] += loss.item()
                sums["entropy"] += ent.sum().item()
                sums["low"] += (clip["low"] * mask).sum().item()
                sums["high"] += (clip["high"] * mask).sum().item()
                sums["gap"] += ((old - beh).abs() * mask).sum().item()
        if self.dp is not None:
            if not chunks:  # nothing to train on this rank; it still joins the gradient sync
                self.dp.join()
            sums = dict(zip(sums, self.dp.sum(list(sums.values()))))
        if self.context is not None:  # every rank of a group ran its chunks, each on its own tokens
            self.context.reduce_gradients(self.params)
            sums = dict(zip(sums, self.context.sum_all(list(sums.values()))))
        grad_norm = clip_and_step(self.params, self.optimizer, self.scheduler, self.train_cfg.grad_clip, sums["loss"])
        if self.dp is not None:
            self.dp.publish(self.policy)
        m.update({
            "kl": sums["kl"] / n_tok, "entropy": sums["entropy"] / n_tok, "loss": sums["loss"],
            "clip_ratio/low_mean": sums["low"] / n_tok, "clip_ratio/high_mean": sums["high"] / n_tok,
            "clip_ratio/region_mean": (sums["low"] + sums["high"]) / n_tok, "grad_norm": grad_norm,
            "logprob_gap": sums["gap"] / n_tok, "timing/ref": t_ref, "num_tokens": int(n_tok),
            "timing/update_actor": time.perf_counter() - t0 - t_ref,
        })
        return m
