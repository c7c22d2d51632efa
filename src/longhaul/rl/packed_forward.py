"""The packed training forward of a Llama / Qwen2 causal LM: no padding in the linear layers.

Owns `PackedBatch` (the layout: every sequence's tokens laid end to end in one flat batch of N
rows, and how attention sees them), its builders (`pack_pairs`: prompt+completion pairs;
`pack_shared`: one prompt and N completions, the prompt computed once; `pack_targets`: rows
with a loss mask, as multi-turn SFT trains them), `hidden_states` (the
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

In fp32 on a CPU, RMSNorm, SwiGLU and the move of q, k, v into SDPA's padded rows run through
the native kernels (`packed_native`). The boolean attention mask becomes SDPA's additive float
mask once a forward, not once a layer and pass.

A batch may also be one rank's shard of a row split over a context-parallel group
(`context_parallel.packed.ContextGroup.shard`): then `context` holds the attention across the
group, which replaces the attention rows; the rest of the forward runs on the local rows as ever.

A differentiable forward of more than `CHECKPOINT_ROWS` flat rows keeps only each layer's input
and recomputes the layer in the backward (activation checkpointing): SmolLM2's 30 layers hold
about a megabyte of activations a token (bf16 autocast and LoRA add copies), so a GRPO
micro-batch of two 2,000-token episodes would hold ~4 GB, against ~0.3 GB of layer inputs and
one layer's worth here, for one more forward of the layers. The threshold is low (256 rows):
even a micro-batch of two prompts with eight short completions each (~900 rows) would hold ~1
GB, a quarter again of what a full fine-tuning run of this model holds between steps.
Attention over long rows runs in tiles (`tiled_attention`). A context-parallel rank counts its
own shard's rows against the threshold.

Numerics: the same operations as HF's eager/SDPA Llama (RMSNorm in fp32 by `F.rms_norm`, or in
fp32 on CPU by the native kernels' forward and backward, equal to rounding; HF's
rotary tables, RoPE with the tables in the hidden state's dtype as HF applies them); fp32 equals
HF's forward to rounding (tests: 1e-5 on log-probs, 1e-4 relative on gradients).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from longhaul.malloc import within_step
from longhaul.models.lora import unwrap
from longhaul.ops.autocast import autocast_dtype
from longhaul.ops.linear import pack
from longhaul.ops.rope import rotate_half
from longhaul.rl.packed_native import NativeSwiGLU, kernels_for, native_attention, rms_norm
from longhaul.rl.tiled_attention import packed_sdpa, query_positions, worth_tiling

SUPPORTED = ("llama", "qwen2")
CHECKPOINT_ROWS = 256  # a differentiable forward of more flat rows than this recomputes each layer in backward


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (N,) every sequence's tokens end to end
    positions: torch.Tensor  # (N,) position of each row within its sequence
    q_index: torch.Tensor  # (R, Tq) flat rows queried by each attention row (pads point at row 0)
    kv_index: torch.Tensor  # (R, Lk) flat rows each attention row attends over, in position order
    out_index: torch.Tensor  # (N,) where each flat row's output sits in the (R * Tq) padded queries
    pick: torch.Tensor  # (M,) flat row whose state predicts each completion token, M = all completion tokens
    pick_slot: torch.Tensor  # (M,) that token's slot in the (B * T) completion grid
    targets: torch.Tensor  # (B, T) completion ids, pad_id past each end
    mask: torch.Tensor  # (B, T) float, 1 on completion tokens
    q_len: torch.Tensor  # (R,) real queries of each attention row (the rest of q_index is padding)
    kv_len: torch.Tensor  # (R,) real keys of each attention row
    # this rank's attention across a context-parallel group (`context_parallel.packed.ContextShard`),
    # which then replaces the attention rows above; None: every row of the batch is here
    context: object | None = None


def supports(model) -> bool:
    """True when `hidden_states` and the fused head can run `model` (else use the HF forward)."""
    m = unwrap(model)
    cfg = getattr(m, "config", None)
    head = m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None
    return (cfg is not None and cfg.model_type in SUPPORTED and getattr(cfg, "hidden_act", "silu") == "silu"
            and not getattr(cfg, "use_sliding_window", False) and not getattr(cfg, "attention_dropout", 0.0)
            and type(head) is torch.nn.Linear and head.bias is None and hasattr(m.base_model, "layers"))


def _layout(rows: list[tuple[list[int], int]], n: int):
    """Attention rows (kv flat rows in position order, number of trailing queries) -> index tensors;
    query j of a row of t queries over L keys sits at key position L - t + j and sees keys 0 .. L - t + j
    (the mask itself is made only where SDPA needs it: `_allowed`)."""
    rows = [(kv, t) for kv, t in rows if t > 0]
    R, Tq, Lk = len(rows), max(t for _, t in rows), max(len(kv) for kv, _ in rows)
    q_index = torch.zeros((R, Tq), dtype=torch.long)
    kv_index = torch.zeros((R, Lk), dtype=torch.long)
    out_index = torch.full((n,), -1, dtype=torch.long)
    q_len = torch.tensor([t for _, t in rows], dtype=torch.long)
    kv_len = torch.tensor([len(kv) for kv, _ in rows], dtype=torch.long)
    for r, (kv, t) in enumerate(rows):
        L = len(kv)
        kv_index[r, :L] = torch.tensor(kv)
        q_index[r, :t] = torch.tensor(kv[L - t:])
        out_index[torch.tensor(kv[L - t:])] = r * Tq + torch.arange(t)
    assert (out_index >= 0).all(), "every flat row must be queried exactly once"
    return q_index, kv_index, out_index, q_len, kv_len


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
    q_index, kv_index, out_index, q_len, kv_len = _layout(rows, len(ids))
    pick, slot, targets, cmask = _completion_grid(completions, picks, pad_id)
    return PackedBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(pos, dtype=torch.long), q_index, kv_index,
                       out_index, pick, slot, targets, cmask, q_len, kv_len)


def pack_pairs(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> PackedBatch:
    """(prompt, completion) pairs, each its own causal sequence, laid end to end. A sequence's
    last token predicts nothing here, so it gets no row (as in the sampler, which never feeds it)."""
    ids, pos, rows, picks = [], [], [], []
    for p, c in pairs:
        off, seq = len(ids), (p + c)[:-1] if c else p
        ids += seq
        pos += range(len(seq))
        rows.append((list(range(off, off + len(seq))), len(seq)))
        picks.append(list(range(off + len(p) - 1, off + len(p) - 1 + len(c))))  # row i predicts token i + 1
    return _batch(ids, pos, rows, [c for _, c in pairs], picks, pad_id)


def pack_shared(prompt: list[int], completions: list[list[int]], pad_id: int) -> PackedBatch:
    """One prompt and its completions: the prompt's rows once, then each completion's rows but
    its last (which predicts nothing), attending over the prompt and themselves."""
    P = len(prompt)
    ids, pos = list(prompt), list(range(P))
    rows, picks = [(list(range(P)), P)], []
    for c in completions:
        off, fed = len(ids), c[:-1]
        ids += fed
        pos += range(P, P + len(fed))
        rows.append((list(range(P)) + list(range(off, off + len(fed))), len(fed)))
        # token 0 is predicted by the prompt's last row, token j by the completion's row j - 1
        picks.append(([P - 1] + list(range(off, off + len(c) - 1))) if c else [])
    return _batch(ids, pos, rows, completions, picks, pad_id)


def pack_targets(seqs: list[tuple[list[int], list[int]]], pad_id: int) -> PackedBatch:
    """Token rows with a loss mask (1 where the token is a target: a multi-turn SFT row's
    assistant tokens), each its own causal sequence, laid end to end. The completion grid holds
    each row's target tokens in order; token j of a row is predicted by its flat row j - 1, so
    the LM head runs on the target positions only. A row's last token predicts nothing and gets
    no flat row; a row's first token is never a target."""
    ids, pos, rows, picks, targets = [], [], [], [], []
    for x, m in seqs:
        off, seq = len(ids), x[:-1]
        ids += seq
        pos += range(len(seq))
        rows.append((list(range(off, off + len(seq))), len(seq)))
        at = [j for j in range(1, len(x)) if m[j]]
        picks.append([off + j - 1 for j in at])
        targets.append([x[j] for j in at])
    return _batch(ids, pos, rows, targets, picks, pad_id)


def _attention(q, k, v, b: PackedBatch, hkv: int, mask: torch.Tensor) -> torch.Tensor:
    """q (N, Hq, D), k, v (N, Hkv, D) -> (N, Hq * D) over the batch's attention rows; `mask`
    from `_sdpa_mask`."""
    n, hq, d = q.shape
    g = hq // hkv
    R, Tq = b.q_index.shape
    Lk = b.kv_index.shape[1]
    qp = q.index_select(0, b.q_index.reshape(-1)).view(R, Tq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(R, hkv, g * Tq, d)
    kp = k.index_select(0, b.kv_index.reshape(-1)).view(R, Lk, hkv, d).transpose(1, 2)
    vp = v.index_select(0, b.kv_index.reshape(-1)).view(R, Lk, hkv, d).transpose(1, 2)
    o = packed_sdpa(qp, kp, vp, b.q_len, b.kv_len, g, mask)  # (R, Hkv, G * Tq, D)
    o = o.view(R, hkv, g, Tq, d).permute(0, 3, 1, 2, 4).reshape(R * Tq, hq * d)
    return o.index_select(0, b.out_index)


def _sdpa_mask(b: PackedBatch, g: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The attention mask with the G query heads of a KV head folded into the query length, as
    an additive float mask (0 / -inf), made once a forward: given the boolean one, SDPA
    converts it again in every layer's forward and backward (~0.1 s a GRPO step). None when the
    dense mask would be large (`tiled_attention.worth_tiling`): then attention runs in tiles."""
    (R, Tq), Lk = b.q_index.shape, b.kv_index.shape[1]
    return None if worth_tiling(R, g * Tq, Lk) else _dense_mask(b, g, dtype)


def _allowed(b: PackedBatch) -> torch.Tensor:
    """(R, 1, Tq, Lk) True = attend: each real query sees its row's keys up to its own position
    (`_layout`); a pad query sees key 0 only (no empty softmax)."""
    Tq, Lk = b.q_index.shape[1], b.kv_index.shape[1]
    qpos = query_positions(b.q_len, b.kv_len, Tq)
    real = torch.arange(Tq)[None, :] < b.q_len[:, None]
    ok = (torch.arange(Lk)[None, None, :] <= qpos[:, :, None]) & real[:, :, None]
    ok[:, :, 0] = True
    return ok[:, None]


def _dense_mask(b: PackedBatch, g: int, dtype: torch.dtype) -> torch.Tensor:
    allowed = _allowed(b)
    R, _, Tq, Lk = allowed.shape
    allowed = allowed.expand(R, g, Tq, Lk).reshape(R, 1, g * Tq, Lk)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))


_PACKED: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple]" = weakref.WeakKeyDictionary()


def fast_linear(module):
    """A callable equal to `module` (to fp32 rounding): for a frozen plain fp32 nn.Linear run
    without autograd (the reference model), its oneDNN-prepacked copy (`ops.linear.pack`:
    ~15% faster at ~1,000 rows), re-packed when the weight is replaced or changed in place
    through autograd-visible ops (version counter). Only frozen weights: the fused AdamW step
    updates parameters without bumping their version, so a trainable weight's copy could go
    stale unseen. Anything else (trainable, LoRA layers, bf16 autocast): the module itself."""
    w = getattr(module, "weight", None)
    if (type(module) is not torch.nn.Linear or w.dtype != torch.float32 or w.requires_grad or torch.is_grad_enabled()
            or autocast_dtype(w.device) is not None):
        return module
    key = (w._version, w.data_ptr())
    hit = _PACKED.get(module)
    if hit is None or hit[0] != key:
        packed, left = pack(w.detach(), None if module.bias is None else module.bias.detach(), few_rows=False)
        if left is not None or not callable(packed):  # no oneDNN here: nothing faster than the module
            return module
        hit = _PACKED[module] = (key, packed)
    return hit[1]


class _StoredLinear(torch.autograd.Function):
    """A linear whose output y was recorded by the sampler (`rollout_activations`): the forward
    returns y without a matmul; the backward is the linear's, for W the row-stack of
    (w1, b1, w2, b2, ...) (fused qkv / gate_up columns in the runner's order)."""

    @staticmethod
    def forward(ctx, x, y, *params):
        ctx.has = [p is not None for p in params]
        ctx.save_for_backward(x, *[p for p in params if p is not None])
        # y is a (rows, width) tensor of its own (`RolloutActivations.gather`), so the output
        # may alias it; a view into a larger record would make autograd build every gradient
        # against the whole record (as_strided), ~3x the step
        return y if y.is_contiguous() else y.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, g):
        x, *saved = ctx.saved_tensors
        it = iter(saved)
        params = [next(it) if has else None for has in ctx.has]
        gx, grads, col = None, [], 0
        for w, b in zip(params[0::2], params[1::2]):
            gi = g[:, col:col + w.shape[0]]
            col += w.shape[0]
            gx = gi @ w if gx is None else gx.addmm_(gi, w)
            grads += [gi.t() @ x, None if b is None else gi.sum(0)]
        return (gx, None, *grads)


def _proj(x, y, *modules, fused: bool = False):
    """x through the modules' linears (prepacked where possible), or their recorded output y
    (N, sum of out features), split per module; `fused`: the recorded output whole (a list of one)."""
    if y is None:
        return [fast_linear(m)(x) for m in modules]
    out = _StoredLinear.apply(x, y, *(t for m in modules for t in (m.weight, m.bias)))
    # one piece is not split: the backward of a split copies its gradients back together
    return [out] if fused or len(modules) == 1 else out.split([m.out_features for m in modules], dim=-1)


def _rope(x, cos, sin):
    """x (N, H, D) rotated by cos, sin (N, D), the tables in the hidden state's dtype (as HF)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def _self_attention(qkv, b: PackedBatch, cos, sin, shape: tuple[int, int, int], kernels, masks: dict) -> torch.Tensor:
    """One layer's attention of the flat rows (N, Hq * D) from their q, k, v projections (fused, or
    three): across the group for a context-parallel shard, else over the batch's attention rows,
    through the native layout kernels where they run. `masks` caches the SDPA mask by dtype."""
    hq, hkv, d = shape
    n = qkv[0].shape[0]
    native = b.context is None and kernels is not None and all(t.dtype == torch.float32 for t in qkv)
    dtype = qkv[0].dtype
    if b.context is None and dtype not in masks:
        mask = _sdpa_mask(b, hq // hkv, dtype)
        masks[dtype] = None if mask is None else mask.to(qkv[0].device)
    if native:
        return native_attention(qkv, b, cos, sin, hq, hkv, masks[dtype], kernels)
    q, k, v = qkv if len(qkv) == 3 else qkv[0].split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = _rope(q.view(n, hq, d), cos, sin), _rope(k.view(n, hkv, d), cos, sin), v.view(n, hkv, d)
    return b.context.attention(q, k, v) if b.context is not None else _attention(q, k, v, b, hkv, masks[dtype])


def hidden_states(model, b: PackedBatch, stored: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
    """Final-normed hidden states (N, H) of the batch's flat rows. `stored`: per layer the rows'
    recorded [qkv, o, gate_up, down] outputs (each (N, width)), used instead of the matmuls."""
    base = unwrap(model).base_model
    cfg = base.config
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    dev = base.embed_tokens.weight.device
    ids, pos = b.input_ids.to(dev), b.positions.to(dev)
    h = base.embed_tokens(ids)  # (N, E)
    cos, sin = base.rotary_emb(h[None], pos[None])
    cos, sin = cos[0], sin[0]  # (N, D)
    # native only when the rotary tables span the whole head (the kernels rotate all D dims)
    kernels = kernels_for(h) if cos.dtype == torch.float32 and d % 2 == 0 and cos.shape[-1] == d else None
    masks = {}  # SDPA's mask, made at the first attention in the dtype the projections produce
    # a context-parallel shard recomputes too: every rank's backward reaches its layers in the same
    # order, so the attention collectives a recomputed layer repeats still meet on every rank
    recompute = torch.is_grad_enabled() and ids.shape[0] > CHECKPOINT_ROWS
    for i, layer in enumerate(base.layers):
        ys = [None] * 4 if stored is None else stored[i]  # qkv, o, gate_up, down
        if recompute:
            h = checkpoint(_bounded_layer, h, layer, ys, b, cos, sin, (hq, hkv, d), kernels, masks, use_reentrant=False)
        else:
            h = _layer(h, layer, ys, b, cos, sin, (hq, hkv, d), kernels, masks)
    return rms_norm(h, base.norm, kernels)


def _bounded_layer(*args) -> torch.Tensor:
    """`_layer`, run (and recomputed in the backward) with the free heap first bounded
    (`malloc.within_step`, where a limit is set): under glibc the layers' large transients do not
    all fit the holes earlier layers left, so over 30 layers of long rows the kept heap would
    otherwise grow by gigabytes."""
    within_step()
    return _layer(*args)


def _layer(h, layer, ys, b: PackedBatch, cos, sin, shape, kernels, masks: dict) -> torch.Tensor:
    """One decoder layer over the flat rows (see `hidden_states`); `masks` is the forward's mask
    cache, so a recomputed layer attends with the mask its forward made."""
    attn, mlp = layer.self_attn, layer.mlp
    x = rms_norm(h, layer.input_layernorm, kernels)
    qkv = _proj(x, ys[0], attn.q_proj, attn.k_proj, attn.v_proj, fused=kernels is not None)
    a = _self_attention(qkv, b, cos, sin, shape, kernels, masks)
    h = h + _proj(a, ys[1], attn.o_proj)[0]
    x = rms_norm(h, layer.post_attention_layernorm, kernels)
    gu = _proj(x, ys[2], mlp.gate_proj, mlp.up_proj, fused=kernels is not None)
    if kernels is not None and all(t.dtype == torch.float32 for t in gu):
        act = NativeSwiGLU.apply(gu[0], gu[1] if len(gu) == 2 else None, kernels)
    else:
        gate, up = gu if len(gu) == 2 else gu[0].chunk(2, dim=-1)
        act = F.silu(gate) * up
    return h + _proj(act, ys[3], mlp.down_proj)[0]
