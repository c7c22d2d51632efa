"""Per-token log-probabilities of completions under a causal LM.

The LM head runs only at the positions that predict completion tokens: prompt positions
never pay for the (hidden x vocab) projection.
"""

from __future__ import annotations

import contextlib

import torch


def pack(pairs: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-pad prompt+completion pairs.

    Returns input_ids (B, L), attention_mask (B, L), gather index (B, T) of the positions
    whose logits predict each completion token, targets (B, T) and completion mask (B, T)."""
    lengths = [len(p) + len(c) for p, c in pairs]
    B, L, T = len(pairs), max(lengths), max(len(c) for _, c in pairs)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    index = torch.zeros((B, T), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    for b, (p, c) in enumerate(pairs):
        ids[b, : lengths[b]] = torch.tensor(p + c)
        attn[b, : lengths[b]] = 1
        index[b, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
        targets[b, : len(c)] = torch.tensor(c)
        mask[b, : len(c)] = 1
    return ids, attn, index, targets, mask


def autocast_ctx(dtype: str):
    if dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def completion_logprobs(model, pairs, pad_id: int, temperature: float = 1.0, autocast: str = "none", with_entropy: bool = False):
    """Log-probs (B, T) of each completion token at `temperature`, its mask (B, T), and
    optionally the per-token entropy (B, T, no grad)."""
    ids, attn, index, targets, mask = pack(pairs, pad_id)
    device = next(model.parameters()).device
    ids, attn, index, targets, mask = (x.to(device) for x in (ids, attn, index, targets, mask))
    with autocast_ctx(autocast):
        hidden = model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, L, H)
        picked = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, T, H)
        logits = model.get_output_embeddings()(picked)  # (B, T, V)
    logits = logits.float() / temperature
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logp, mask, entropy
