"""A batched sampler over any HF causal LM with a dynamic KV cache.

Finished rows leave the batch (their cache rows are dropped), so one long sample does not
keep a whole batch decoding. Returns token ids and the behaviour log-probability of each
sampled token *after* temperature and top-p (the distribution the token was drawn from;
for greedy, the raw model distribution). Not a serving engine: no paging, no prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from longhaul.models.compat import cache_kwarg


@dataclass(frozen=True)
class RolloutParams:
    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()  # stop strings, matched on the completion text only
    batch_size: int = 64  # rows decoded together

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Completion:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" (eos or stop string) or "length"
    versions: list[int] = field(default_factory=list)  # weight version of each token; empty: the caller's version


def _process(logits: torch.Tensor, p: RolloutParams) -> torch.Tensor:
    """(B, V) raw logits -> (B, V) log-probs of the sampling distribution."""
    logits = logits.float()
    if p.temperature > 0:
        logits = logits / p.temperature
    if 0 < p.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token once the mass before it already reaches top_p (the top token always stays)
        drop = probs.cumsum(-1) - probs >= p.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits.log_softmax(-1)


def _sample(logp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Inverse-CDF sampling, one uniform per row. torch.multinomial draws from a shared
    generator across threads and is not reproducible on CPU; this is."""
    cdf = logp.exp().cumsum(-1)  # (B, V)
    u = torch.rand((logp.shape[0], 1), generator=gen, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp(max=logp.shape[-1] - 1)


def _stopped(tok, ids: list[int], stop: tuple[str, ...], eos: set[int]) -> bool:
    if ids[-1] in eos:
        return True
    if not stop:
        return False
    tail = tok.decode(ids[-8:], skip_special_tokens=False)
    return any(s in tail for s in stop)


@torch.no_grad()
def _generate_batch(model, tok, prompts: list[list[int]], p: RolloutParams, gen: torch.Generator) -> list[Completion]:
    device = next(model.parameters()).device
    n, width = len(prompts), max(len(x) for x in prompts)
    pad = tok.pad_token_id
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, x in enumerate(prompts):  # left padding keeps every row's last token at the end
        ids[i, width - len(x):] = torch.tensor(x)
        mask[i, width - len(x):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)
    cache = DynamicCache(config=model.config)
    eos = {t for t in ([model.generation_config.eos_token_id] if isinstance(model.generation_config.eos_token_id, int) else (model.generation_config.eos_token_id or [])) if t is not None}
    if tok.eos_token_id is not None:
        eos.add(tok.eos_token_id)
    out = [Completion() for _ in range(n)]
    active = list(range(n))  # row r of the batch is request active[r]
    kw = cache_kwarg(model)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **{kw: cache}).logits[:, -1]
    next_pos = pos[:, -1:] + 1
    for _ in range(p.max_new_tokens):
        logp = _process(logits, p)
        if p.temperature == 0:
            tokens = logp.argmax(-1)
        else:
            tokens = _sample(logp, gen)
        chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
        keep = []
        for r, req in enumerate(active):
            c = out[req]
            c.token_ids.append(int(tokens[r]))
            c.logprobs.append(float(chosen[r]))
            if _stopped(tok, c.token_ids, p.stop, eos):
                c.finish_reason = "stop"
            elif len(c.token_ids) < p.max_new_tokens:
                keep.append(r)
        if not keep:
            break
        if len(keep) < len(active):
            idx = torch.tensor(keep, device=device)
            cache.batch_select_indices(idx)
            tokens, mask, next_pos = tokens[idx], mask[idx], next_pos[idx]
            active = [active[r] for r in keep]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos, use_cache=True, **{kw: cache}).logits[:, -1]
        next_pos = next_pos + 1
    return out


def generate(model, tok, prompts: list[list[int]], params: RolloutParams, seed: int = 0) -> list[Completion]:
    """Sample one completion per prompt (repeat a prompt for a group). Deterministic for a seed."""
    if not prompts or any(len(x) == 0 for x in prompts):
        raise ValueError("every prompt needs at least one token")
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        results: list[Completion] = []
        for start in range(0, len(prompts), params.batch_size):
            results += _generate_batch(model, tok, prompts[start:start + params.batch_size], params, gen)
        return results
    finally:
        model.train(was_training)
