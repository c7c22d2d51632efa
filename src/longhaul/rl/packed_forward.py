"""The packed training forward of a Llama / Qwen2 causal LM: no padding in the linear layers.

Owns `PackedBatch` (the layout: every sequence's tokens laid end to end in one flat batch of N
rows, and how attention sees them), its two builders (`pack_pairs`: prompt+completion pairs;
`pack_shared`: one prompt and N completions, the prompt computed once), `hidden_states` (the
decoder over the flat rows, differentiable in the HF model's own parameters, so the optimizer,
LoRA adapters and checkpoints are untouched) and `supports` (which models it runs). Does not
own the LM head / log-softmax (`fused_head`) or which sequences form a batch (the trainers).

Why: the HF forward pads every sequence to the longest (a GRPO group of 8 completions of
~110 tokens padded to 128 runs ~15% pad rows through every matmul, forward and backward),
recomputes masks, and its RMSNorm / RoPE are chains of small elementwise ops. Here the
linears, norms and MLP run over the N real rows only; attention alone is padded, as a batch of
R "attention rows" (R, Tq) of queries against (R, Lk) keys with a mask, through PyTorch SDPA
(GQA folded into the query length, no K/V repeat). In `pack_shared` layout the prompt's rows are
gathered into every completion's keys, so gradients from all N completions reach the prompt,
as with `shared_prompt_logprobs`' repeated cache.

Numerics: the same operations as HF's eager/SDPA Llama (RMSNorm in fp32 by `F.rms_norm`, HF's
rotary tables, RoPE with the tables in the hidden state's dtype as HF applies them); fp32 equals
HF's forward to rounding (tests: 1e-5 on log-probs, 1e-4 relative on gradients).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from longhaul.inference.linear import linear, pack
from longhaul.inference.rope import rotate_half
from longhaul.models.lora import unwrap

SUPPORTED = ("llama", "qwen2")


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (N,) every sequence's tokens end to end
    positions: torch.Tensor  # (N,) position of each row within its sequence
    q_index: torch.Tensor  # (R, Tq) flat rows queried by each attention row (pads point at row 0)
    kv_index: torch.Tensor  # (R, Lk) flat rows each attention row attends over, in position order
    attn_mask: torch.Tensor  # (R, 1, Tq, Lk) True = attend (a pad query sees key 0 only: no empty softmax)
    out_index: torch.Tensor  # (N,) where each flat row's output sits in the (R * Tq) padded queries
    pick: torch.Tensor  # (M,) flat row whose state predicts each completion token, M = all completion tokens
    pick_slot: torch.Tensor  # (M,) that token's slot in the (B * T) completion grid
    targets: torch.Tensor  # (B, T) completion ids, pad_id past each end
    mask: torch.Tensor  # (B, T) float, 1 on completion tokens


def supports(model) -> bool:
    """True when `hidden_states` and the fused head can run `model` (else use the HF forward)."""
    m = unwrap(model)
    cfg = getattr(m, "config", None)
    head = m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None
    return (cfg is not None and cfg.model_type in SUPPORTED and getattr(cfg, "hidden_act", "silu") == "silu"
            and not getattr(cfg, "use_sliding_window", False) and not getattr(cfg, "attention_dropout", 0.0)
            and type(head) is torch.nn.Linear and head.bias is None and hasattr(m.base_model, "layers"))


def _layout(rows: list[tuple[list[int], int]], n: int):
    """Attention rows (kv flat rows in position order, number of trailing queries) -> index tensors."""
    rows = [(kv, t) for kv, t in rows if t > 0]
    R, Tq, Lk = len(rows), max(t for _, t in rows), max(len(kv) for kv, _ in rows)
    q_index = torch.zeros((R, Tq), dtype=torch.long)
    kv_index = torch.zeros((R, Lk), dtype=torch.long)
    mask = torch.zeros((R, 1, Tq, Lk), dtype=torch.bool)
    mask[:, :, :, 0] = True
    out_index = torch.full((n,), -1, dtype=torch.long)
    for r, (kv, t) in enumerate(rows):
        L = len(kv)
        kv_index[r, :L] = torch.tensor(kv)
        q_index[r, :t] = torch.tensor(kv[L - t:])
        out_index[torch.tensor(kv[L - t:])] = r * Tq + torch.arange(t)
        # query j sits at key position L - t + j and sees keys 0 .. L - t + j
        mask[r, 0, :t, :L] = torch.arange(L)[None, :] <= (L - t + torch.arange(t))[:, None]
    assert (out_index >= 0).all(), "every flat row must be queried exactly once"
    return q_index, kv_index, mask, out_index


def _completion_grid(completions: list[list[int]], picks: list[list[int]], pad_id: int):
    """Targets (B, T), mask (B, T), and for each completion token its predicting flat row
    (`picks[b][j]` for completion b's token j) and its slot in the (B * T) grid."""
    B, T = len(completions), max(len(c) for c in completions)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    pick, slot = [], []
    for b, (c, rows) in enumerate(zip(completions, picks)):
        targets[b, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[b, : len(c)] = 1
        pick += rows
        slot += range(b * T, b * T + len(c))
    return torch.tensor(pick, dtype=torch.long), torch.tensor(slot, dtype=torch.long), targets, mask


def _batch(ids: list[int], pos: list[int], rows, completions: list[list[int]], picks: list[list[int]], pad_id: int) -> PackedBatch:
    q_index, kv_index, mask, out_index = _layout(rows, len(ids))
    pick, slot, targets, cmask = _completion_grid(completions, picks, pad_id)
    return PackedBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(pos, dtype=torch.long), q_index, kv_index, mask,
                       out_index, pick, slot, targets, cmask)


def pack_pairs(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> PackedBatch:
    """(prompt, completion) pairs, each its own causal sequence, laid end to end."""
    ids, pos, rows, picks = [], [], [], []
    for p, c in pairs:
        off, seq = len(ids), p + c
        ids += seq
        pos += range(len(seq))
        rows.append((list(range(off, off + len(seq))), len(seq)))
        picks.append(list(range(off + len(p) - 1, off + len(seq) - 1)))  # row i predicts token i + 1
    return _batch(ids, pos, rows, [c for _, c in pairs], picks, pad_id)


def pack_shared(prompt: list[int], completions: list[list[int]], pad_id: int) -> PackedBatch:
    """One prompt and its completions: the prompt's rows once, then each completion's rows,
    which attend over the prompt and themselves."""
    P = len(prompt)
    ids, pos = list(prompt), list(range(P))
    rows, picks = [(list(range(P)), P)], []
    for c in completions:
        off = len(ids)
        ids += c
        pos += range(P, P + len(c))
        rows.append((list(range(P)) + list(range(off, off + len(c))), len(c)))
        # token 0 is predicted by the prompt's last row, token j by the completion's row j - 1
        picks.append(([P - 1] + list(range(off, off + len(c) - 1))) if c else [])
    return _batch(ids, pos, rows, completions, picks, pad_id)


def _attention(q, k, v, b: PackedBatch, hkv: int) -> torch.Tensor:
    """q (N, Hq, D), k, v (N, Hkv, D) -> (N, Hq * D) over the batch's attention rows."""
    n, hq, d = q.shape
    g = hq // hkv
    R, Tq = b.q_index.shape
    Lk = b.kv_index.shape[1]
    qp = q.index_select(0, b.q_index.reshape(-1)).view(R, Tq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(R, hkv, g * Tq, d)
    kp = k.index_select(0, b.kv_index.reshape(-1)).view(R, Lk, hkv, d).transpose(1, 2)
    vp = v.index_select(0, b.kv_index.reshape(-1)).view(R, Lk, hkv, d).transpose(1, 2)
    mask = b.attn_mask.expand(R, g, Tq, Lk).reshape(R, 1, g * Tq, Lk)
    o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)  # (R, Hkv, G * Tq, D)
    o = o.view(R, hkv, g, Tq, d).permute(0, 3, 1, 2, 4).reshape(R * Tq, hq * d)
    return o.index_select(0, b.out_index)


_PACKED: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple]" = weakref.WeakKeyDictionary()


def frozen_linear(module):
    """The layer itself, or for a frozen plain nn.Linear run without autograd (the reference
    model), its oneDNN-prepacked copy (`inference.linear.pack`: ~15% faster at ~1,000 rows),
    re-packed whenever the weight changes in place (tracked by its version counter)."""
    w = getattr(module, "weight", None)
    if type(module) is not torch.nn.Linear or torch.is_grad_enabled() or w.requires_grad or w.dtype != torch.float32:
        return module
    key = (w._version, w.data_ptr())
    hit = _PACKED.get(module)
    if hit is None or hit[0] != key:
        packed, bias = pack(w.detach(), None if module.bias is None else module.bias.detach())
        hit = _PACKED[module] = (key, packed, bias)
    _, packed, bias = hit
    return lambda x: linear(x, packed, bias)


def _rope(x, cos, sin):
    """x (N, H, D) rotated by cos, sin (N, D), the tables in the hidden state's dtype (as HF)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def hidden_states(model, b: PackedBatch) -> torch.Tensor:
    """Final-normed hidden states (N, H) of the batch's flat rows."""
    base = unwrap(model).base_model
    cfg = base.config
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    dev = base.embed_tokens.weight.device
    ids, pos = b.input_ids.to(dev), b.positions.to(dev)
    h = base.embed_tokens(ids)  # (N, E)
    n, e = h.shape
    cos, sin = base.rotary_emb(h[None], pos[None])
    cos, sin = cos[0], sin[0]  # (N, D)
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qp, kp, vp, op, gp, up, dp = (frozen_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                                                   mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        x = F.rms_norm(h, (e,), layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        q = _rope(qp(x).view(n, hq, d), cos, sin)
        k = _rope(kp(x).view(n, hkv, d), cos, sin)
        v = vp(x).view(n, hkv, d)
        h = h + op(_attention(q, k, v, b, hkv))
        x = F.rms_norm(h, (e,), layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        h = h + dp(F.silu(gp(x)) * up(x))
    return F.rms_norm(h, (e,), base.norm.weight, base.norm.variance_epsilon)
