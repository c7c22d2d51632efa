"""Per-token log-probabilities of completions under a causal LM.

The LM head runs only at the positions that predict completion tokens: prompt positions
never pay for the (hidden x vocab) projection. With `fast=True` (the GRPO trainer's choice),
Llama / Qwen2 models take the packed path (`packed_forward`: no pad rows in the linears;
`fused_head`: the head and log-softmax chunked, no extra (tokens x vocab) copies); other models,
and the default `fast=False`, take HF's padded forward. Both give the same values and gradients
to fp32 rounding; the default stays HF's so that the other trainers' numerics (and their
rounding-sensitive accumulation tests) are unchanged.
"""

from __future__ import annotations

import torch

from longhaul.models.compat import cache_kwarg
from longhaul.ops.autocast import autocast as autocast_ctx
from longhaul.models.lora import unwrap
from longhaul.rl import packed_forward
from longhaul.rl.fused_head import head_logprobs


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> input_ids (B, L) right-padded with pad_id, and attention_mask (B, L)."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        attn[b, : len(s)] = 1
    return ids, attn


def pack(pairs: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-pad prompt+completion pairs.

    Returns input_ids (B, L), attention_mask (B, L), gather index (B, T) of the positions
    whose logits predict each completion token, targets (B, T) and completion mask (B, T)."""
    B, T = len(pairs), max(len(c) for _, c in pairs)
    ids, attn = right_pad([p + c for p, c in pairs], pad_id)
    index = torch.zeros((B, T), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    for b, (p, c) in enumerate(pairs):
        index[b, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
        targets[b, : len(c)] = torch.tensor(c)
        mask[b, : len(c)] = 1
    return ids, attn, index, targets, mask


def _token_logprobs(logits, targets, mask, temperature: float, with_entropy: bool, entropy_grad: bool = False):
    """(B, T, V) logits -> log-prob of each target (B, T), the mask, optional entropy (B, T)."""
    logits = logits.float() / temperature
    norm = logits.logsumexp(-1)  # (B, T); avoids a second (B, T, V) tensor for log_softmax
    logp = (logits.gather(-1, targets[..., None]).squeeze(-1) - norm) * mask
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = (norm - (logits.softmax(-1) * logits).sum(-1)) * mask
    return logp, mask, entropy


def packed_logprobs(model, batch: packed_forward.PackedBatch, temperature: float = 1.0, autocast: str = "none",
                    with_entropy: bool = False, entropy_grad: bool = False, recorded=None):
    """`completion_logprobs`' result for a `packed_forward.PackedBatch`: (B, T) log-probs, mask,
    entropy. `recorded`: (per layer the rows' [qkv, o, gate_up, down] outputs, logits (M, V)) of
    the batch's rows from the sampler (`rollout_activations`), used instead of the forward's
    matmuls; the call consumes them (the logits are overwritten)."""
    model = unwrap(model)
    dev = model.get_output_embeddings().weight.device
    pick, slot, mask = batch.pick.to(dev), batch.pick_slot.to(dev), batch.mask.to(dev)
    targets = batch.targets.to(dev).view(-1).index_select(0, slot)  # (M,)
    with autocast_ctx(autocast):
        acts, logits = recorded if recorded is not None else (None, None)
        rows = packed_forward.hidden_states(model, batch, acts).index_select(0, pick)  # (M, H)
        if with_entropy and entropy_grad and torch.is_grad_enabled():  # an entropy bonus: plain head, autograd entropy
            lp, _, ent = _token_logprobs(model.get_output_embeddings()(rows)[None], targets[None], torch.ones_like(targets[None], dtype=torch.float32),
                                         temperature, True, True)
            lp, ent = lp[0], ent[0]
        else:
            head = model.get_output_embeddings()
            packed = packed_forward.fast_linear(head)  # the prepacked head for the forward's logits
            lp, ent = head_logprobs(rows, head.weight, targets, temperature, with_entropy, None if packed is head else packed, logits,
                                    logits_scratch=logits is not None)
    grid = lambda x: x.new_zeros(mask.numel()).index_copy(0, slot, x).view(mask.shape)  # noqa: E731  (M,) -> (B, T), 0 past ends
    return grid(lp), mask, None if ent is None else grid(ent)


def completion_logprobs(model, pairs, pad_id: int, temperature: float = 1.0, autocast: str = "none", with_entropy: bool = False,
                        entropy_grad: bool = False, fast: bool = False):
    """Log-probs (B, T) of each completion token at `temperature`, its mask (B, T), and
    optionally the per-token entropy (B, T; no grad unless `entropy_grad`)."""
    if fast and packed_forward.supports(model):
        return packed_logprobs(model, packed_forward.pack_pairs(pairs, pad_id), temperature, autocast, with_entropy, entropy_grad)
    model = unwrap(model)  # a peft wrapper's inner CausalLM carries the adapters
    ids, attn, index, targets, mask = pack(pairs, pad_id)
    device = next(model.parameters()).device
    ids, attn, index, targets, mask = (x.to(device) for x in (ids, attn, index, targets, mask))
    with autocast_ctx(autocast):
        hidden = model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, L, H)
        picked = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, T, H)
        logits = model.get_output_embeddings()(picked)  # (B, T, V)
    return _token_logprobs(logits, targets, mask, temperature, with_entropy, entropy_grad)


def shared_prompt_logprobs(model, prompt: list[int], completions: list[list[int]], pad_id: int, temperature: float = 1.0,
                           autocast: str = "none", with_entropy: bool = False, entropy_grad: bool = False, fast: bool = False):
    """Same result as `completion_logprobs` for N completions of one prompt, with the prompt
    run once: its keys/values are computed a single time and repeated for the N rows
    (gradients flow back through the repeat), so a group of N costs P + N*C tokens, not N*(P+C)."""
    if fast and packed_forward.supports(model):
        return packed_logprobs(model, packed_forward.pack_shared(prompt, completions, pad_id), temperature, autocast, with_entropy,
                               entropy_grad)
    from transformers import DynamicCache

    model = unwrap(model)
    device = next(model.parameters()).device
    n, T, P = len(completions), max(len(c) for c in completions), len(prompt)
    comp = torch.full((n, T), pad_id, dtype=torch.long)
    mask = torch.zeros((n, T), dtype=torch.float32)
    for b, c in enumerate(completions):
        comp[b, : len(c)] = torch.tensor(c)
        mask[b, : len(c)] = 1
    comp, mask = comp.to(device), mask.to(device)
    kw = cache_kwarg(model.base_model)
    cache = DynamicCache(config=model.config)
    with autocast_ctx(autocast):
        ids = torch.tensor([prompt], device=device)
        first = model.base_model(input_ids=ids, use_cache=True, **{kw: cache}).last_hidden_state[:, -1:]  # (1, 1, H)
        cache.batch_repeat_interleave(n)
        attn = torch.cat([torch.ones((n, P), dtype=torch.long, device=device), mask.long()], dim=1)
        pos = torch.arange(P, P + T, device=device).expand(n, T)
        rest = model.base_model(input_ids=comp, attention_mask=attn, position_ids=pos, use_cache=True, **{kw: cache}).last_hidden_state
        hidden = torch.cat([first.expand(n, 1, -1), rest[:, : T - 1]], dim=1)  # (N, T, H): state before each token
        logits = model.get_output_embeddings()(hidden)
    return _token_logprobs(logits, comp, mask, temperature, with_entropy, entropy_grad)
