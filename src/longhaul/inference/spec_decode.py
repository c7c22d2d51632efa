"""Speculative decoding maths: exact rejection sampling, n-gram prompt lookup, counters.

Owns the pure parts of speculative decoding: the acceptance probability and residual
distribution of Leviathan et al. / Chen et al. 2023, the batched verification step
`rejection_sample` (sampled and greedy rows in one call), the deterministic n-gram
proposer and the counters the engine reports. Does not own running models, KV caches or
scheduling: the engine-side driver (`spec_worker`) proposes, scores and rolls back.

All distributions are the *sampling* distributions (after temperature / top-p), so the
output follows exactly what plain sampling from `target_probs` would produce.

Deviations from the papers:
- a deterministic proposer (n-gram lookup) passes `draft_probs=None`, read as one-hot q at
  the draft token; the same accept/residual maths then accepts with probability p(x);
- rows may carry fewer drafts than `k` (`draft_lens`); a position past a row's drafts has
  q = 0, so its "residual" is p itself and the row simply samples one plain token there;
- greedy rows accept iff the draft is the target argmax and emit the argmax otherwise;
  this is the p -> one-hot(argmax p) limit of the same rule and needs no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

Generators = torch.Generator | list[torch.Generator] | None


def acceptance_prob(p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)). p, q (..., V) with q None for one-hot q at x; x (...) long -> (...).

    q(x) = 0 (a token the draft could not have proposed) accepts iff p(x) > 0, the limit
    of `u * q(x) < p(x)`."""
    p_x = p.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    if q is None:
        return p_x.clamp(max=1.0)
    q_x = q.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    ratio = (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1.0)
    return torch.where(q_x > 0, ratio, (p_x > 0).to(p_x.dtype))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dim, (..., V) -> (..., V).

    Where p == q the residual is empty and a rejection has probability 0; p is returned
    there so the result is always a distribution."""
    r = (p - q).clamp(min=0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp(min=torch.finfo(r.dtype).tiny), p)


def _uniforms(B: int, k: int, lens: torch.Tensor, generator: Generators, device) -> torch.Tensor:
    """(B, k+1) uniforms in [0, 1): columns < lens[b] test acceptances, column k draws the
    last token. With one generator a row (per-request seeds), row b draws exactly lens[b] + 1
    of them, so its stream does not depend on what else shares the batch."""
    if not isinstance(generator, list):
        return torch.rand((B, k + 1), generator=generator, dtype=torch.float64).to(device)
    if len(generator) != B:
        raise ValueError(f"got {len(generator)} generators for {B} rows; pass one a row or a single one")
    u = torch.zeros((B, k + 1), dtype=torch.float64)
    for b, (g, n) in enumerate(zip(generator, lens.tolist())):
        r = torch.rand(n + 1, generator=g, dtype=torch.float64)
        u[b, :n], u[b, k] = r[:n], r[n]
    return u.to(device)


def _sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw, (B, V) probs and (B,) uniforms -> (B,) long. `right=True` never
    lands on a zero-probability token, even for u = 0."""
    cdf = probs.double().cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: Generators = None,
    *,
    draft_lens: torch.Tensor | None = None,
    greedy: torch.Tensor | bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify k drafted tokens per row against the target; emit the accepted prefix plus one token.

    draft_tokens (B, k) long; draft_probs (B, k, V) or None (one-hot: a deterministic
    proposer); target_probs (B, k+1, V), position i scored after the prefix plus x_<i;
    draft_lens (B,) drafts per row (default k; padding past it is ignored); greedy (B,) bool
    or one bool for the batch. generator: one, or one a row; unused by greedy rows.
    Returns output_tokens (B, k+1) long, padded with -1 after the emitted tokens, and
    num_accepted (B,) long: row b emits num_accepted[b] + 1 tokens.
    """
    B, k = draft_tokens.shape
    V = target_probs.shape[-1]
    device = target_probs.device
    if target_probs.shape[:2] != (B, k + 1):
        raise ValueError(f"target_probs must be (B, k+1, V) = ({B}, {k + 1}, V), got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != (B, k, V):
        raise ValueError(f"draft_probs must be (B, k, V) = ({B}, {k}, {V}), got {tuple(draft_probs.shape)}")
    greedy = torch.as_tensor(greedy, dtype=torch.bool, device=device).expand(B)
    lens = torch.full((B,), k, device=device) if draft_lens is None else torch.as_tensor(draft_lens, device=device).long()
    has_draft = torch.arange(k, device=device) < lens[:, None]  # (B, k)
    x = draft_tokens.to(device).clamp(min=0)  # padding (-1) is masked by has_draft

    if bool(greedy.all()):
        u = torch.zeros((B, k + 1), dtype=torch.float64, device=device)
    elif generator is None:
        raise ValueError("rejection_sample needs a generator for sampled (non-greedy) rows")
    else:
        u = _uniforms(B, k, lens, generator, device)

    argmax = target_probs.argmax(-1)  # (B, k+1)
    accept_p = acceptance_prob(target_probs[:, :k], draft_probs, x)  # (B, k)
    accept_p = torch.where(greedy[:, None], (argmax[:, :k] == x).to(accept_p.dtype), accept_p)
    accepted = (u[:, :k] < accept_p) & has_draft
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # (B,) first rejection, or k

    # Position n = num_accepted: residual after a rejection, p_k itself after k acceptances.
    rows = torch.arange(B, device=device)
    p_n = target_probs[rows, num_accepted]  # (B, V)
    rejected_draft = num_accepted < lens  # a real draft was rejected at n (q_n != 0)
    n_draft = num_accepted.clamp(max=max(k - 1, 0))
    if k == 0:
        q_n = torch.zeros_like(p_n)
    elif draft_probs is None:
        q_n = torch.nn.functional.one_hot(x[rows, n_draft], V).to(p_n.dtype)
    else:
        q_n = draft_probs[rows, n_draft].to(p_n.dtype)
    q_n = q_n * rejected_draft[:, None]
    dist = residual(p_n, q_n)
    last = torch.where(greedy, argmax[rows, num_accepted], _sample(dist, u[:, k]))

    out = torch.full((B, k + 1), -1, dtype=torch.long, device=device)
    pos = torch.arange(k + 1, device=device)
    out[:, :k] = torch.where(pos[:k] < num_accepted[:, None], x, out[:, :k])
    out[rows, num_accepted] = last
    return out, num_accepted


def greedy_verify(draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_lens: torch.Tensor | None = None):
    """Greedy verification for the whole batch: `rejection_sample` with every row greedy."""
    return rejection_sample(draft_tokens, None, target_probs, draft_lens=draft_lens, greedy=True)


class NgramProposer:
    """Prompt lookup decoding: match the last n tokens (n from n_max down to n_min) against
    their most recent earlier occurrence in prompt + output and propose the k tokens that
    followed it.

    Deviation: a match whose continuation runs into the end of the sequence continues with
    its own proposals (the repeat it found, extended periodically), so a loop of period d
    shorter than k still yields k tokens rather than d.
    """

    def __init__(self, n_min: int = 1, n_max: int = 3, k: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        if k < 1:
            raise ValueError(f"k (tokens to propose) must be >= 1, got {k}")
        self.n_min, self.n_max, self.k = n_min, n_max, k

    def propose(self, token_ids: list[int]) -> list[int]:
        ids = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.n_max, len(ids) - 1), self.n_min - 1, -1):
            # windows start at 0 .. len-n-1: every earlier n-gram, not the suffix itself
            windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
            hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                ext = list(token_ids)
                for j in range(self.k):  # start + j < len(ext): always defined
                    ext.append(ext[start + j])
                return ext[len(token_ids):]
        return []


@dataclass
class SpecCounters:
    """Cumulative speculative decoding counters (vLLM's spec_decode_num_drafts,
    spec_decode_num_draft_tokens, spec_decode_num_accepted_tokens and
    spec_decode_num_accepted_tokens_per_pos)."""

    num_drafts: int = 0  # verification steps of a sequence with at least one drafted token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts whose token i was accepted

    def record(self, draft_lens: torch.Tensor | list[int], num_accepted: torch.Tensor | list[int]) -> None:
        lens = torch.as_tensor(draft_lens).cpu().long()
        acc = torch.as_tensor(num_accepted).cpu().long()
        self.num_drafts += int((lens > 0).sum())
        self.num_draft_tokens += int(lens.sum())
        self.num_accepted_tokens += int(acc.sum())
        for n in acc.tolist():
            if n > len(self.accepted_per_pos):
                self.accepted_per_pos += [0] * (n - len(self.accepted_per_pos))
            for i in range(n):
                self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens; nan before any draft."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per draft: accepted + the one correction or bonus token (vLLM's
        definition, so 1.0 means nothing was ever accepted); nan before any draft."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    def as_metrics(self, prefix: str = "spec_decode_") -> dict[str, float]:
        return {
            f"{prefix}num_drafts": self.num_drafts,
            f"{prefix}num_draft_tokens": self.num_draft_tokens,
            f"{prefix}num_accepted_tokens": self.num_accepted_tokens,
            f"{prefix}acceptance_rate": self.acceptance_rate,
            f"{prefix}mean_acceptance_length": self.mean_acceptance_length,
        }
