"""Distillation from a teacher model: token-level divergences on teacher logits (offline), and
on-policy distillation where the student samples and the teacher scores its samples.

Owns the registered divergences (`DISTILL_LOSSES`), the teacher/student vocabulary check and
the two trainers. Does not own loading the teacher (`longhaul.models.load_policy`), sampling
(the runtime hands `OnPolicyDistillTrainer` the same groups it hands `GRPOTrainer`) or datasets.

Deviations from the papers:
- Hinton et al. multiply the tempered KL by tau^2 to keep gradient scales comparable across
  temperatures; here the divergence is returned as is (the learning rate absorbs the factor).
- `jsd` is GKD's generalised JSD(beta) (Agarwal et al. 2024) with P = teacher, Q = student;
  beta is kept in the open interval (0, 1) by the config, so no special-cased KL end points.
- On-policy distillation (GKD with lambda = 1; Thinking Machines 2025) is run as policy
  gradient, not by back-propagating the full-vocabulary divergence: each sampled token's
  advantage is the negative per-token reverse-KL estimate log pi_teacher - log pi_student
  (k1, behaviour log-probs of the sampler; with top_p < 1 those are the truncated sampler's),
  with one optimizer step per batch as in `GRPOTrainer`. The teacher scores at the sampling temperature; `algo.kl_coef` (a KL to a
  frozen reference) is not used, the teacher already anchors the policy.
"""

from __future__ import annotations

import math
import time

import torch

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.errors import LonghaulError
from longhaul.malloc import within_step
from longhaul.models.lora import unwrap
from longhaul.rl.grpo import GRPOTrainer, padded_rows
from longhaul.ops.autocast import autocast as autocast_ctx  # a name apart from the `autocast` arguments
from longhaul.rl.logprobs import right_pad
from longhaul.rl.losses import aggregate, entropy_bonus, off_policy_weight
from longhaul.rl.optim import OptimizerState, advance_schedule, clip_and_step, make_optimizer
from longhaul.rl.registry import Registry
from longhaul.types import Trajectory

DISTILL_LOSSES = Registry("distillation loss")


def _logp(logits, temperature: float):
    """Tempered log-softmax over the last axis, in at least fp32 (bf16 logits are upcast)."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, -1)


def _kl(logp, logq):
    """KL(p || q) = sum_v p_v (log p_v - log q_v) over the last axis, from log-probs (..., V) -> (...)."""
    return (logp.exp() * (logp - logq)).sum(-1)


@DISTILL_LOSSES.register("forward_kl")
def forward_kl(student_logits, teacher_logits, temperature: float = 1.0, **_):
    """KL(p_t || p_s) = sum_v p_t(v) [log p_t(v) - log p_s(v)], p = softmax(logits / tau).

    The classic knowledge-distillation loss (Hinton et al. 2015): mean-seeking, the student
    must cover every token the teacher gives mass to. (B, T, V) x 2 -> per-token loss (B, T)."""
    s, t = _logp(student_logits, temperature), _logp(teacher_logits, temperature)
    return _kl(t, s)


@DISTILL_LOSSES.register("reverse_kl")
def reverse_kl(student_logits, teacher_logits, temperature: float = 1.0, **_):
    """KL(p_s || p_t) = sum_v p_s(v) [log p_s(v) - log p_t(v)], p = softmax(logits / tau).

    Mode-seeking: the student may drop teacher modes but is punished for mass where the
    teacher has little (MiniLLM, Gu et al. 2024). (B, T, V) x 2 -> per-token loss (B, T)."""
    s, t = _logp(student_logits, temperature), _logp(teacher_logits, temperature)
    return _kl(s, t)


@DISTILL_LOSSES.register("jsd")
def jsd(student_logits, teacher_logits, temperature: float = 1.0, beta: float = 0.5, **_):
    """Generalised Jensen-Shannon divergence (GKD, Agarwal et al. 2024), P = p_t, Q = p_s:

        JSD(beta) = beta KL(P || M) + (1 - beta) KL(Q || M),   M = beta P + (1 - beta) Q.

    JSD(beta) / beta -> KL(P || Q) (forward) as beta -> 0 and JSD(beta) / (1 - beta) ->
    KL(Q || P) (reverse) as beta -> 1; bounded by the binary entropy of beta. The mixture is
    formed in log space (logsumexp), never from exponentiated logits.
    (B, T, V) x 2 -> per-token loss (B, T); beta in (0, 1)."""
    s, t = _logp(student_logits, temperature), _logp(teacher_logits, temperature)
    m = torch.logaddexp(t + math.log(beta), s + math.log1p(-beta))  # log M, (B, T, V)
    return beta * _kl(t, m) + (1 - beta) * _kl(s, m)


def output_width(model) -> int:
    """Number of logits the model emits per position (its output-embedding rows)."""
    return unwrap(model).get_output_embeddings().weight.shape[0]


def check_vocab(student_width: int, teacher_width: int, vocab_size: int | None = None) -> int:
    """How many logit columns the two models share: all of them when the widths agree, else
    min(width) when every extra row is padding (at or past `vocab_size`, the tokenizer's
    length); anything else means different vocabularies and raises."""
    if student_width == teacher_width:
        return student_width
    shared = min(student_width, teacher_width)
    if vocab_size is not None and vocab_size <= shared:
        return shared
    known = f", tokenizer {vocab_size}" if vocab_size is not None else ""
    raise LonghaulError(f"teacher vocabulary ({teacher_width} logits) differs from the student's ({student_width} logits{known}); "
                        f"distil from a teacher of the same tokenizer family (or pass vocab_size=len(tokenizer) if the extra rows are padding)")


def _positions(seqs: list[tuple[list[int], list[int]]], pad_id: int):
    """input_ids (B, L), attention_mask (B, L), `sel` (B, L) true at the positions whose logits
    predict a loss token (mask 1 on ids[1:]), and those target ids (N,)."""
    ids, attn = right_pad([x for x, _ in seqs], pad_id)
    sel = torch.zeros(ids.shape, dtype=torch.bool)
    for b, (_, m) in enumerate(seqs):
        sel[b, : len(m) - 1] = torch.tensor(m[1:], dtype=torch.bool)
    return ids, attn, sel, ids.roll(-1, dims=1)[sel]


def _logits_at(model, ids, attn, sel, autocast: str, width: int):
    """Logits (N, width) in fp32 at the N selected positions: the LM head runs there only."""
    model = unwrap(model)
    device = next(model.parameters()).device
    with autocast_ctx(autocast):
        hidden = model.base_model(input_ids=ids.to(device), attention_mask=attn.to(device)).last_hidden_state  # (B, L, H)
        logits = model.get_output_embeddings()(hidden[sel.to(device)])  # (N, V)
    return logits[:, :width].float()


class DistillTrainer(OptimizerState):
    """Offline distillation on teacher logits over SFT-style batches: lists of (ids, mask),
    mask 1 on the tokens to learn (assistant tokens). The loss is the per-token divergence
    summed over loss tokens / the batch's count of loss tokens, so micro-batch accumulation
    gives exactly the full-batch gradient."""

    def __init__(self, student, teacher, pad_id: int, algo: AlgoConfig, train: TrainConfig, vocab_size: int | None = None):
        self.student, self.teacher, self.pad_id, self.algo, self.train_cfg = student, teacher, pad_id, algo, train
        self.name = algo.distill_loss
        self.loss_fn = DISTILL_LOSSES.get_fn(self.name)
        self.width = check_vocab(output_width(student), output_width(teacher), vocab_size)
        self.teacher.eval()
        self.optimizer, self.scheduler = make_optimizer(student.parameters(), train)

    def _chunk(self, seqs):
        """Per-token divergence (N,), student log-prob of each target (N,) and the teacher's (N,, no grad)."""
        ids, attn, sel, targets = _positions(seqs, self.pad_id)
        with torch.no_grad():
            t = _logits_at(self.teacher, ids, attn, sel, self.train_cfg.autocast, self.width)
        s = _logits_at(self.student, ids, attn, sel, self.train_cfg.autocast, self.width)
        t, targets = t.to(s.device), targets.to(s.device)
        div = self.loss_fn(s, t, temperature=self.algo.distill_temperature, beta=self.algo.jsd_beta)
        with torch.no_grad():
            lp_s = s.gather(-1, targets[:, None]).squeeze(-1) - s.logsumexp(-1)
            lp_t = t.gather(-1, targets[:, None]).squeeze(-1) - t.logsumexp(-1)
        return div, lp_s, lp_t

    def _count(self, batch) -> float:
        n = float(sum(sum(m[1:]) for _, m in batch))
        if n == 0:
            raise ValueError("batch has no loss tokens (no assistant content)")
        return n

    def step(self, batch: list[tuple[list[int], list[int]]]) -> dict:
        """One optimizer step; metrics loss, distill/<name>, ce (student), grad_norm, num_tokens, lr."""
        n_tok, mb = self._count(batch), self.train_cfg.micro_batch
        lr = self.scheduler.get_last_lr()[0]
        self.student.train()
        total, ce = 0.0, 0.0
        for i in range(0, len(batch), mb):
            div, lp_s, _ = self._chunk(batch[i:i + mb])
            loss = div.sum() / n_tok
            loss.backward()
            within_step()  # bound the kept heap between micro-batches (`malloc.within_step`)
            total += loss.item()
            ce -= lp_s.sum().item()
        grad_norm = clip_and_step(self.student.parameters(), self.optimizer, self.scheduler, self.train_cfg.grad_clip, total)
        return {"loss": total, f"distill/{self.name}": total, "ce": ce / n_tok, "grad_norm": grad_norm,
                "num_tokens": int(n_tok), "lr": lr}

    @torch.no_grad()
    def evaluate(self, batch: list[tuple[list[int], list[int]]]) -> dict:
        """Held-out means over loss tokens: heldout/divergence (algo.distill_loss), the student's
        cross-entropy heldout/ce, and the teacher's heldout/teacher_ce for comparison."""
        n_tok, mb = self._count(batch), self.train_cfg.micro_batch
        was_training = self.student.training
        self.student.eval()
        div = ce = tce = 0.0
        for i in range(0, len(batch), mb):
            d, lp_s, lp_t = self._chunk(batch[i:i + mb])
            div, ce, tce = div + d.sum().item(), ce - lp_s.sum().item(), tce - lp_t.sum().item()
        self.student.train(was_training)
        return {"heldout/divergence": div / n_tok, "heldout/ce": ce / n_tok, "heldout/teacher_ce": tce / n_tok}


class OnPolicyDistillTrainer(GRPOTrainer):
    """On-policy distillation: the student's own samples (GRPO's input, `list[list[Trajectory]]`)
    are scored by the teacher, and each model token's advantage is

        A_t = -(log pi_student(x_t) - log pi_teacher(x_t))   (detached; behaviour log-probs),

    optionally plus `reward_weight` times the outcome reward's group advantage
    (`algo.advantage`, off by default). The update is `POLICY_LOSSES[algo.loss]` with these
    per-token advantages, reduced by `aggregate`. Environment tokens (loss_mask 0) carry no
    loss; infra-error trajectories are dropped; groups with equal rewards are kept (they still
    carry the teacher's signal). Reuses GRPOTrainer's batching (shared prompts, micro-batches),
    optimizer and state_dict."""

    def __init__(self, policy, teacher, pad_id: int, algo: AlgoConfig, train: TrainConfig, temperature: float = 1.0,
                 max_new_tokens: int = 128, reward_weight: float = 0.0, vocab_size: int | None = None):
        check_vocab(output_width(policy), output_width(teacher), vocab_size)
        algo = algo.model_copy(update={"kl_coef": 0.0, "drop_zero_std_groups": False})
        super().__init__(policy, pad_id, algo, train, temperature, max_new_tokens)
        self.teacher, self.reward_weight = teacher, reward_weight
        self.teacher.eval()

    def step(self, groups: list[list[Trajectory]]) -> dict:
        """One optimizer step; metrics reward (outcome, logging only), distill/reverse_kl (mean
        per model token), loss, grad_norm, num_tokens, entropy, num_trained_seqs, lr, timings, and
        kl = 0.0 (GRPO's KL to a frozen reference, which this trainer does not keep)."""
        t0 = time.perf_counter()
        rewards, _, seqs, outcome, sizes = self.select(groups)
        m = {"reward": rewards.mean().item(), "num_trained_seqs": len(seqs), "lr": self.scheduler.get_last_lr()[0], "kl": 0.0}
        if not seqs:
            advance_schedule(self.scheduler)
            return {**m, "distill/reverse_kl": float("nan"), "loss": 0.0, "grad_norm": 0.0, "num_tokens": 0,
                    "entropy": float("nan"), "timing/teacher": 0.0, "timing/update_actor": time.perf_counter() - t0}
        pairs = [(s.prompt_ids, s.completion_ids) for s in seqs]
        env_masks = [s.loss_mask for s in seqs]
        n_tok, n_seq = float(sum(sum(x) for x in env_masks)), float(len(pairs))
        max_len = max(self.max_new_tokens, max(len(c) for _, c in pairs))  # as GRPOTrainer: Dr. GRPO's constant normaliser
        chunks = self._units(pairs, sizes)
        t_teacher = time.perf_counter()
        with torch.no_grad():
            teacher_logps = [self._logprobs(self.teacher, pairs, idx)[0] for idx in chunks]
        t_teacher = time.perf_counter() - t_teacher

        self.policy.train()
        sums = {"rkl": 0.0, "loss": 0.0, "entropy": 0.0}
        for k, idx in enumerate(chunks):
            logp, mask, ent = self._logprobs(self.policy, pairs, idx, with_entropy=True, entropy_grad=self.algo.entropy_coef > 0)
            mask = mask * padded_rows([env_masks[i] for i in idx], mask)
            old = logp.detach()  # one update per batch: the old policy is the current one
            beh = padded_rows([seqs[i].logprobs for i in idx], old)  # the sampler's log-probs, (B, T)
            rkl = (beh - teacher_logps[k].to(beh.device)) * mask  # per-token reverse-KL estimate, (B, T)
            adv = -rkl
            if self.reward_weight:
                adv = adv + self.reward_weight * padded_rows([outcome[i] for i in idx], adv) * mask
            tok_loss, _ = self.loss_fn(logp, old, adv, clip_low=self.algo.clip_low, clip_high=self.algo.clip_high,
                                       clip_c=self.algo.dual_clip_c, mask=mask)
            if (w := off_policy_weight(self.algo.off_policy, old, beh, self.algo.tis_cap)) is not None:
                tok_loss = tok_loss * w
            if self.algo.entropy_coef > 0:
                tok_loss = tok_loss + entropy_bonus(ent, self.algo.entropy_coef)
            loss = aggregate(tok_loss, mask, self.algo.aggregation, n_tok, n_seq, max_len)
            loss.backward()
            within_step()  # bound the kept heap between micro-batches (`malloc.within_step`)
            sums["loss"] += loss.item()
            sums["rkl"] += rkl.sum().item()
            sums["entropy"] += (ent.detach() * mask).sum().item()
        grad_norm = clip_and_step(self.policy.parameters(), self.optimizer, self.scheduler, self.train_cfg.grad_clip, sums["loss"])
        return {**m, "distill/reverse_kl": sums["rkl"] / n_tok, "loss": sums["loss"], "grad_norm": grad_norm,
                "num_tokens": int(n_tok), "entropy": sums["entropy"] / n_tok, "timing/teacher": t_teacher,
                "timing/update_actor": time.perf_counter() - t0 - t_teacher}
