"""The model runner: one forward of a Llama / Qwen2-family decoder over the paged KV cache.

Owns the weights (copied out of the HF model into plain tensors: q/k/v fused into one matrix,
gate/up into another, nothing shared with the HF module; an engine then keeps only the packed
form of its projections, `drop_plain`), the forward over a flat batch of new
tokens (every sequence's new tokens laid end to end, no padding in the linear layers),
attention over the paged cache with PyTorch SDPA, and logits at the requested positions only.
In fp32 or bf16 on a CPU where `kernels.native()` builds, decode attention reads the blocks in place
(`decode_attention`, no gather or mask), RoPE and the cache write are one pass
(`rope_and_cache`), RMSNorm is the native one and the linears are its small-batch GEMM
(`linear.pack`); prefill chunks keep SDPA. A decode step's layers run in one native call
(`DecodeLayers`), and `decode_sample` runs a whole step of one-token items there, from their
tokens to the sampled next ones (the sampler's temperature-only draw, bit for bit).
Does not own which tokens run (`scheduler`), the blocks (`block_manager`) or sampling's rules.

One forward serves every kind of step. A `BatchItem` is a sequence's new tokens starting at
position `start` over the `start` tokens already in its cache:
- decode: one new token, one logit row;
- a prefill chunk: many new tokens, one logit row if the chunk ends the prompt, else none;
- speculative verification (`spec_decode`): k + 1 new tokens (the last accepted token and k
  drafts) with `num_logits = k + 1`, the same path as a prefill chunk over an existing cache.
  Rejected drafts are rolled back with `BlockManager.truncate` (KV slots past the new end are
  simply overwritten later; whole blocks past it are freed).

Numerics: weights and activations in `dtype` (fp32 matches HF to ~1e-6; bf16 keeps HF's bf16
residual stream), RMSNorm by `F.rms_norm`, RoPE by `rope.Rope` / `apply_rope`, logits
returned in float32.

Recording: with `recorder` set (an object with `begin(batch)`, `layer(i, qkv, o, gate_up,
down)`, `logits(logits)` and `clear()`), every forward hands it each layer's linear outputs and
the logits, and `prepare` notes which item (block table) owns which rows; `load_weights` clears
it. `rl.rollout_activations` uses this to reuse a rollout's forward as the training forward.

LoRA adapters (`set_lora`): a slot's rank-r updates of the attention and MLP projections, added
to the rows of the tokens that run with it (`BatchItem.lora`), so one forward serves the base
model and any number of adapters side by side (multi-LoRA serving, as vLLM and SGLang batch it);
a batch with adapter tokens runs the per-layer path, not the one-call native decode step.

Extension points: every projection goes through `linear.linear(x, w, b)`, so a weight may be
any callable `w(x) = x @ W.T`. `pack_weights()` turns the plain weights in `layers` into what
the forward calls (`linear.pack` on CPU: the native small-batch kernels for fp32 and bf16 decode
steps, oneDNN-prepacked weights for many rows); an INT8 weight-only linear (`quant.py`, on its
native kernel for decode steps) can take a weight's place there. The KV storage is the `KVCache` passed in (a
quantized subclass drops in). `attention` is one method, the place for a fused paged-attention
kernel on a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from longhaul.errors import LonghaulError
from longhaul.inference.kv_cache import KVCache
from longhaul.ops.kernels import native
from longhaul.ops.linear import (PackedLinear, SmallBatchLinear, SmallBatchLinearBF16, linear, native_description, native_layers,
                                 pack)
from longhaul.ops.rope import Rope, apply_rope

SUPPORTED = ("llama", "qwen2")
# PEFT's names: `base_model.model.<HF weight name less .weight>.lora_A[.<adapter>].weight`
_LORA_NAME = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$")


@dataclass
class BatchItem:
    """One sequence's share of a forward."""

    token_ids: list[int]  # the new tokens
    start: int  # position of the first new token = tokens already in the cache
    block_table: list[int]  # covering start + len(token_ids) tokens
    num_logits: int = 1  # logits for the last num_logits new tokens
    lora: int = 0  # the LoRA adapter slot its tokens run with (`ModelRunner.set_lora`); 0: the base weights


@dataclass
class ForwardBatch:
    """Tensors of one forward, built once by `ModelRunner.prepare`. Decode items come first in N."""

    input_ids: torch.Tensor  # (N,)
    positions: torch.Tensor  # (N,)
    slot_mapping: torch.Tensor  # (N,)
    logits_indices: torch.Tensor  # (S,) rows of N, in item order
    num_decode: int  # Bd: items with one new token, tokens [0, Bd) of N
    decode_block_tables: torch.Tensor | None  # (Bd, nb)
    decode_mask: torch.Tensor | None  # (Bd, 1, 1, nb * block_size), True = attend; None for the native attention
    decode_lens: torch.Tensor | None  # (Bd,) context lengths, this step's token included
    chunks: list[tuple[int, int, torch.Tensor, torch.Tensor]]  # (offset in N, T, block table (1, nb), mask (G*T, L))
    owners: list[tuple[list[int], int, int, int]] | None = None  # with a recorder: (block table, start, tokens, offset in N) an item
    lora: list[tuple[int, torch.Tensor | None]] = ()  # (adapter slot, its rows of N; None: every row) for slots other than 0


class _Layer:
    __slots__ = ("ln1", "qkv", "qkv_b", "o", "o_b", "ln2", "gate_up", "gate_up_b", "down", "down_b")


# a layer's projections -> where their packed form and bias sit in its `_exec` row
_PROJECTIONS = {"qkv": 1, "o": 3, "gate_up": 6, "down": 8}


def _unpackable(w) -> bool:
    return isinstance(w, (PackedLinear, SmallBatchLinear, SmallBatchLinearBF16))


def _unpack(w) -> torch.Tensor:
    """The plain weight (M, K) of a packed float linear without a bias, read back exactly: each
    output of w(I) sums one product with 1.0 and zeros."""
    if not _unpackable(w):
        raise LonghaulError(f"a {type(w).__name__} weight cannot be read back; rebuild the engine to change its weights")
    return w(torch.eye(w.in_features, dtype=w.dtype)).t().contiguous()


class ModelRunner:
    """Weights and forward of one model; `kv` is the paged cache it reads and writes."""

    def __init__(self, model, kv: KVCache, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 max_positions: int | None = None):
        cfg = model.config
        if cfg.model_type not in SUPPORTED:
            raise LonghaulError(f"model type {cfg.model_type!r} is not supported by the engine; supported: {', '.join(SUPPORTED)}")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise LonghaulError(f"activation {cfg.hidden_act!r} is not supported by the engine; only silu (SwiGLU) is")
        if getattr(cfg, "use_sliding_window", False):
            raise LonghaulError("sliding-window attention is not supported by the engine; use a model with full attention")
        self.config, self.kv, self.dtype, self.device = cfg, kv, dtype, torch.device(device)
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.group = self.num_heads // self.num_kv_heads
        self.eps = cfg.rms_norm_eps
        self.rope = Rope(cfg, device=self.device, max_positions=max(max_positions or 0, cfg.max_position_embeddings))
        self.native = None  # fp32 or bf16 on CPU: the native decode kernels (`kernels.native`), when they build here
        if dtype in (torch.float32, torch.bfloat16) and self.device.type == "cpu":
            self.native = native()
        self._load(dict(model.state_dict()))
        self.pack_weights()
        self.recorder = None  # optional: sees every forward's linear outputs and logits (`rl.rollout_activations`)
        # LoRA adapters by slot: (layer, projection) -> (A^T (K, R), B^T * scale (R, M)), ranks of a fused projection's parts side by side
        self.loras: dict[int, dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]] = {}
        self.fused_step = True  # decode-only steps run their layers in one native call (`native_layers`) where they can

    # ---- weights -------------------------------------------------------------------------
    def _t(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=self.device, dtype=self.dtype, copy=True).contiguous()

    def _fuse(self, sd: dict[str, torch.Tensor], holder, attr: str, *names: str) -> None:
        """Set `holder.attr` to the named HF tensors stacked by rows into one plain tensor (None
        if absent), with each name's rows recorded for `load_weights`."""
        parts = [sd[n] for n in names if n in sd]
        if parts and len(parts) != len(names):
            raise LonghaulError(f"model has only some of {', '.join(names)}; the engine needs all or none of a fused group")
        setattr(holder, attr, self._t(torch.cat(parts)) if parts else None)
        row = 0
        for name, part in zip(names, parts):
            self._targets[name] = (holder, attr, row, row + part.shape[0])
            row += part.shape[0]

    def _load(self, sd: dict[str, torch.Tensor]) -> None:
        self._targets: dict[str, tuple[object, str, int, int]] = {}  # HF name -> (holder, attribute, first row, end row)
        self._fuse(sd, self, "embed", "model.embed_tokens.weight")
        self._fuse(sd, self, "norm", "model.norm.weight")
        if getattr(self.config, "tie_word_embeddings", False) or "lm_head.weight" not in sd:
            self.lm_head = self.embed
            self._targets["lm_head.weight"] = self._targets["model.embed_tokens.weight"]
        else:
            self._fuse(sd, self, "lm_head", "lm_head.weight")
        self.layers: list[_Layer] = []
        for i in range(self.config.num_hidden_layers):
            a, m, L = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp.", _Layer()
            self._fuse(sd, L, "ln1", f"model.layers.{i}.input_layernorm.weight")
            self._fuse(sd, L, "ln2", f"model.layers.{i}.post_attention_layernorm.weight")
            self._fuse(sd, L, "qkv", *(f"{a}{x}_proj.weight" for x in "qkv"))
            self._fuse(sd, L, "qkv_b", *(f"{a}{x}_proj.bias" for x in "qkv"))
            self._fuse(sd, L, "o", a + "o_proj.weight")
            self._fuse(sd, L, "o_b", a + "o_proj.bias")
            self._fuse(sd, L, "gate_up", m + "gate_proj.weight", m + "up_proj.weight")
            self._fuse(sd, L, "gate_up_b", m + "gate_proj.bias", m + "up_proj.bias")
            self._fuse(sd, L, "down", m + "down_proj.weight")
            self._fuse(sd, L, "down_b", m + "down_proj.bias")
            self.layers.append(L)
        self._lean = False  # `drop_plain` was called: packed projections keep no plain copy

    def pack_weights(self, packer=None, head_packer=None) -> None:
        """Build what the forward calls from the plain weights. `packer(w, b) -> (callable or
        tensor, bias left to add)` turns each projection into its executable form: by default
        `linear.pack` (the native or oneDNN-prepacked linears on CPU, the tensor itself otherwise), or e.g.
        `quant.quantize_linear` for INT8 linears. `head_packer` does the same for the LM head
        (default `linear.pack`). Both are kept, so `load_weights` re-packs the same way. A
        projection whose plain copy was dropped (`drop_plain`) keeps its packed form, or, for a
        new packer, is unpacked first."""
        new = packer is not None
        self._packer = packer = packer or getattr(self, "_packer", None) or pack
        self._head_packer = head_packer = head_packer or getattr(self, "_head_packer", None) or pack
        old, self._exec = getattr(self, "_exec", []), []
        for i, L in enumerate(self.layers):
            row = [L.ln1, None, None, None, None, L.ln2, None, None, None, None]
            for attr, at in _PROJECTIONS.items():
                w, b = getattr(L, attr), getattr(L, attr + "_b")
                if w is None and old and not new:  # dropped and unchanged: its packed form stands
                    row[at:at + 2] = old[i][at:at + 2]
                    continue
                row[at:at + 2] = packer(w if w is not None else _unpack(old[i][at]), b)
            self._exec.append(tuple(row))
        self._lm_head = head_packer(self.lm_head, None)[0]
        described = native_layers(self._exec) if self.native is not None else None
        # (the layers parsed once for one-call decode steps, the most rows every linear takes natively)
        self._native_layers, self._whole_rows = None, 0  # (the most rows a whole native step takes)
        if described is not None:
            head = self._native_head()
            if head is not None:
                self._whole_rows = min(described[1], head[1])
                head = (self.embed, self.norm, head[0], *self.rope.tables)
            self._native_layers = (self.native.DecodeLayers(described[0], head), described[1])
        if self._lean:
            self._drop()

    def _native_head(self):
        """The LM head described for `DecodeLayers` when whole decode steps can run natively (the
        embedding and final norm in the runner's dtype, the tables on the CPU), with the most rows
        it takes there; else None."""
        if self.embed.dtype != self.dtype or self.norm is None or self.norm.dtype != self.dtype:
            return None
        if self.rope.tables[0].device.type != "cpu":
            return None
        described = native_description(self._lm_head)
        kind = described[0][0] if described is not None else None
        if kind in ("fp32", "bf16") and kind != {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(self.dtype):
            return None  # a float head of another dtype than the layers'
        return described

    def drop_plain(self) -> int:
        """Keep only the packed form of each projection whose packing can be read back exactly
        (the fp32 and bf16 packed linears, without a bias): the plain copy doubles the weights'
        memory and is needed only to re-pack, which `load_weights` and `pack_weights` then do
        from the new or unpacked weights. Stays in force through later packs. Returns the bytes
        dropped."""
        self._lean = True
        return self._drop()

    def _drop(self) -> int:
        dropped = 0
        for L, row in zip(self.layers, self._exec):
            for attr, at in _PROJECTIONS.items():
                w = getattr(L, attr)
                if w is not None and getattr(L, attr + "_b") is None and _unpackable(row[at]):
                    setattr(L, attr, None)
                    dropped += w.numel() * w.element_size()
        return dropped

    def _packed(self, holder: _Layer, attr: str):
        """The packed form of layer `holder`'s projection `attr`."""
        return self._exec[self.layers.index(holder)][_PROJECTIONS[attr]]

    def _plain(self, holder, attr: str) -> torch.Tensor | None:
        """The plain weight at `holder.attr`, unpacked from its packed form where it was dropped."""
        w = getattr(holder, attr)
        if w is None and attr in _PROJECTIONS and holder in self.layers:
            w = _unpack(self._packed(holder, attr))
        return w

    def targets(self) -> dict[str, tuple[torch.Tensor, int, int]]:
        """HF name -> (the plain fused tensor holding it, first row, end row); names fused into
        one tensor share the tensor object. Dropped projections are unpacked for the call."""
        plain: dict[tuple[int, str], torch.Tensor] = {}
        out = {}
        for name, (holder, attr, r0, r1) in self._targets.items():
            key = (id(holder), attr)
            if key not in plain:
                plain[key] = self._plain(holder, attr)
            out[name] = (plain[key], r0, r1)
        return out

    @torch.no_grad()
    def load_weights(self, tensors: dict[str, torch.Tensor]) -> int:
        """Copy HF-named tensors into the runner's weights in place; returns how many were loaded.

        Unknown names (rotary buffers aside) are an error, so a renamed checkpoint cannot load
        silently as a no-op. A partial dict updates only the named tensors (a dropped projection
        given in part is unpacked first, to keep its other rows).
        """
        got: dict[tuple[int, str], list] = {}  # (holder, attribute) -> [holder, rows given]
        for name, t in tensors.items():
            if name.endswith("rotary_emb.inv_freq"):
                continue
            if name not in self._targets:
                raise LonghaulError(f"weight {name!r} does not belong to this {self.config.model_type} model; pass HF parameter names")
            holder, attr, r0, r1 = self._targets[name]
            got.setdefault((id(holder), attr), [holder, 0])[1] += r1 - r0
        for (_, attr), (holder, rows) in got.items():
            if getattr(holder, attr) is None:  # dropped: a buffer to load into, then packed again
                at = self._packed(holder, attr)
                whole = rows >= at.out_features
                setattr(holder, attr, torch.empty((at.out_features, at.in_features), dtype=at.dtype) if whole else _unpack(at))
        loaded = 0
        for name, t in tensors.items():
            if name.endswith("rotary_emb.inv_freq"):
                continue
            holder, attr, r0, r1 = self._targets[name]
            dst = getattr(holder, attr)
            if not isinstance(dst, torch.Tensor):
                raise LonghaulError(f"weight {name!r} is quantized in this engine; rebuild the engine to load new weights")
            if tuple(t.shape) != (r1 - r0, *dst.shape[1:]):
                raise LonghaulError(f"weight {name!r} has shape {tuple(t.shape)}, expected {(r1 - r0, *dst.shape[1:])}")
            dst[r0:r1].copy_(t)
            loaded += 1
        self.pack_weights()
        if self.recorder is not None:  # what it holds was computed under the old weights
            self.recorder.clear()
        return loaded

    # ---- LoRA adapters -------------------------------------------------------------------
    @torch.no_grad()
    def set_lora(self, slot: int, tensors: dict[str, torch.Tensor], scale: float) -> None:
        """Adapter `slot` (>= 1) from PEFT-named `...<proj>.lora_A.weight` (r, K) and
        `...lora_B.weight` (M, r) tensors of the attention and MLP projections; a token run with
        the slot gets `x @ A.T @ B.T * scale` added to each projection's output. Parts of a fused
        projection (q, k, v; gate, up) lay their ranks side by side, each B writing its own rows.
        Replaces what the slot held."""
        if slot < 1:
            raise LonghaulError(f"LoRA slot {slot} is the base weights'; use a slot of 1 or more")
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in tensors.items():
            m = _LORA_NAME.match(name)
            if m is None:
                raise LonghaulError(f"adapter tensor {name!r} is not a LoRA weight; pass PEFT's ...lora_A.weight and ...lora_B.weight")
            target = m.group(1) + ".weight"
            pairs.setdefault(target, {})[m.group(2)] = t
        parts: dict[tuple[int, str], list[tuple[torch.Tensor, torch.Tensor, int, int]]] = {}
        for target, ab in pairs.items():
            where = self._targets.get(target)
            if where is None or where[1] not in _PROJECTIONS or where[0] not in self.layers:
                raise LonghaulError(f"adapter on {target!r}: the engine runs adapters on the attention and MLP projections "
                                    f"(q, k, v, o, gate, up, down) only")
            if set(ab) != {"A", "B"}:
                raise LonghaulError(f"adapter on {target!r} has lora_{''.join(ab)} but not both A and B")
            holder, attr, r0, r1 = where
            a, b = ab["A"], ab["B"]
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or b.shape[0] != r1 - r0:
                raise LonghaulError(f"adapter on {target!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit "
                                    f"a weight of {r1 - r0} rows")
            parts.setdefault((self.layers.index(holder), attr), []).append((a, b, r0, r1))
        out = {}
        for (i, attr), ps in parts.items():
            rank, k = sum(a.shape[0] for a, *_ in ps), ps[0][0].shape[1]
            m = self._rows(i, attr)
            at, bt, c = torch.zeros(k, rank, dtype=self.dtype), torch.zeros(rank, m, dtype=self.dtype), 0
            for a, b, r0, r1 in ps:
                at[:, c:c + a.shape[0]] = a.t()
                bt[c:c + a.shape[0], r0:r1] = b.t() * scale
                c += a.shape[0]
            out[(i, attr)] = (at.to(self.device), bt.to(self.device))
        self.loras[slot] = out

    def drop_lora(self, slot: int) -> None:
        self.loras.pop(slot, None)

    def _rows(self, layer: int, attr: str) -> int:
        """Rows of a layer's (fused) projection: the end of the last HF weight fused into it."""
        holder = self.layers[layer]
        return max(r1 for h, a, _, r1 in self._targets.values() if h is holder and a == attr)

    def _lora(self, y: torch.Tensor, x: torch.Tensor, layer: int, attr: str, batch: ForwardBatch) -> torch.Tensor:
        """y (N, M), the projection of x (N, K), plus each adapter's update on its own rows."""
        for slot, rows in batch.lora:
            ab = self.loras[slot].get((layer, attr))
            if ab is None:
                continue
            if rows is None:
                y.add_((x @ ab[0]) @ ab[1])
            else:
                y.index_add_(0, rows, (x.index_select(0, rows) @ ab[0]) @ ab[1])
        return y

    # ---- batch ---------------------------------------------------------------------------
    def prepare(self, items: list[BatchItem]) -> ForwardBatch:
        """Lay the items' new tokens end to end (decode items first) and build every index and
        mask the forward needs, once per step rather than once per layer."""
        bs, dev = self.kv.block_size, self.device
        order = sorted(range(len(items)), key=lambda i: len(items[i].token_ids) != 1)
        ids, pos, slots, offset = [], [], [], {}
        for i in order:
            it = items[i]
            offset[i] = len(ids)
            ids += it.token_ids
            for p in range(it.start, it.start + len(it.token_ids)):
                pos.append(p)
                slots.append(it.block_table[p // bs] * bs + p % bs)
        logits_idx = [offset[i] + len(items[i].token_ids) - k for i in range(len(items)) for k in range(items[i].num_logits, 0, -1)]
        dec = [items[i] for i in order if len(items[i].token_ids) == 1]
        decode_bt = decode_mask = ctx = None
        if dec:
            nb = max(len(it.block_table) for it in dec)
            decode_bt = torch.tensor([it.block_table + [0] * (nb - len(it.block_table)) for it in dec], device=dev)
            ctx = torch.tensor([it.start + 1 for it in dec], device=dev)
            if not self._native_cache():  # the native attention reads the lengths, not a mask
                decode_mask = (torch.arange(nb * bs, device=dev)[None, :] < ctx[:, None])[:, None, None, :]
        chunks = []
        for i in order[len(dec):]:
            it = items[i]
            t, nb = len(it.token_ids), (it.start + len(it.token_ids) + bs - 1) // bs
            q_pos = torch.arange(it.start, it.start + t, device=dev)
            mask = torch.arange(nb * bs, device=dev)[None, :] <= q_pos[:, None]  # (T, L) causal over the cache
            chunks.append((offset[i], t, torch.tensor([it.block_table[:nb]], device=dev), mask.repeat(self.group, 1)))
        as_t = lambda x: torch.tensor(x, dtype=torch.long, device=dev)  # noqa: E731
        owners = None
        if self.recorder is not None:  # the block table list is the item's identity while it is resident
            owners = [(items[i].block_table, items[i].start, len(items[i].token_ids), offset[i]) for i in order]
        by_slot: dict[int, list[int]] = {}
        for i in order:
            if items[i].lora:
                by_slot.setdefault(items[i].lora, []).extend(range(offset[i], offset[i] + len(items[i].token_ids)))
        lora = [(slot, None if len(rows) == len(ids) else as_t(rows)) for slot, rows in by_slot.items()]
        unknown = [slot for slot in by_slot if slot not in self.loras]
        if unknown:
            raise LonghaulError(f"no LoRA adapter in slot {unknown[0]}; set it with set_lora first")
        return ForwardBatch(as_t(ids), as_t(pos), as_t(slots), as_t(logits_idx), len(dec), decode_bt, decode_mask, ctx, chunks,
                            owners, lora)

    # ---- forward -------------------------------------------------------------------------
    @torch.no_grad()
    def decode_sample(self, items: list[BatchItem], temperatures: list[float], generators: list[torch.Generator]
                      ) -> tuple[list[int], list[float]] | None:
        """A step of one-token items run whole in one native call, from their tokens to the next:
        each item's token is drawn at its temperature (0: greedy) with one uniform from its
        generator, as `forward` and then `sampling.sample` with nothing but the temperature would
        draw it, bit for bit. Returns (tokens, their log-probabilities), or None where the step
        needs `forward`: a chunk of prompt, a LoRA adapter, a recorder, more rows than the native
        kernels take, a position past the RoPE tables, a quantized cache."""
        whole = self._native_layers
        if whole is None or not whole[0].has_head or not self.fused_step or self.recorder is not None \
                or len(items) > self._whole_rows or not self._native_cache():
            return None
        ids, positions, tables = [], [], []
        for it in items:
            if len(it.token_ids) != 1 or it.num_logits != 1 or it.lora or it.start >= self.rope.max_positions:
                return None
            ids.append(it.token_ids[0])
            positions.append(it.start)
            tables.append(it.block_table)
        return whole[0].sample(ids, positions, tables, self.kv.k, self.kv.v, self.kv.block_size, self.num_heads, self.eps,
                               temperatures, generators)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Run the batch, write its K/V to the cache; return float32 logits (S, V) at
        `batch.logits_indices`."""
        h = F.embedding(batch.input_ids, self.embed)  # (N, E)
        n, e = h.shape
        cos, sin = self.rope.cos_sin(batch.positions)
        cos, sin = cos.to(self.dtype), sin.to(self.dtype)  # cast once, not per layer
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        rec = self.recorder
        if rec is not None:
            rec.begin(batch)
        fused_cache = self._native_cache()
        nothing = (None,) * 4
        layers = self._exec
        if self.fused_step and fused_cache and rec is None and self._native_layers is not None and batch.num_decode == n \
                and n <= self._native_layers[1] and not batch.lora:
            layers = ()  # every layer in one native call
            h = self._native_layers[0].run(h, self.kv.k, self.kv.v, cos, sin, batch.slot_mapping,
                                           batch.decode_block_tables, batch.decode_lens, self.kv.block_size, hq, self.eps)
        for i, (ln1, qkv_w, qkv_b, o_w, o_b, ln2, gu_w, gu_b, down_w, down_b) in enumerate(layers):
            # a recorded forward: the projections are written straight into the recorder's rows
            outs = rec.outputs(i) if rec is not None else nothing
            x = self._rms_norm(h, ln1)
            qkv = linear(x, qkv_w, qkv_b, outs[0])
            if batch.lora:
                qkv = self._lora(qkv, x, i, "qkv", batch)
            qkv = qkv.view(n, hq + 2 * hkv, d)
            if fused_cache:  # RoPE and the cache write in one native pass
                q = self.native.rope_and_cache(qkv, cos, sin, self.kv.k[i], self.kv.v[i], batch.slot_mapping, hq)
            else:
                qk = apply_rope(qkv[:, :hq + hkv], cos, sin)  # (N, Hq + Hkv, D)
                self.kv.write(i, batch.slot_mapping, qk[:, hq:], qkv[:, hq + hkv:])
                q = qk[:, :hq]
            a = self.attention(i, q, batch)
            o = linear(a, o_w, o_b, outs[1])
            h = h + (self._lora(o, a, i, "o", batch) if batch.lora else o)
            x = self._rms_norm(h, ln2)
            gu = linear(x, gu_w, gu_b, outs[2])
            gate, up = (self._lora(gu, x, i, "gate_up", batch) if batch.lora else gu).chunk(2, dim=-1)
            act = self.native.swiglu(gate, up) if self.native is not None and gate.dtype == self.dtype else F.silu(gate) * up
            down = linear(act, down_w, down_b, outs[3])
            h = h + (self._lora(down, act, i, "down", batch) if batch.lora else down)
        h = self._rms_norm(h.index_select(0, batch.logits_indices), self.norm)
        logits = linear(h, self._lm_head).float()
        if rec is not None:
            rec.logits(logits)
        return logits

    def _native_cache(self) -> bool:
        """True when the native kernels may read and write the cache's storage directly (the
        plain pool in the runner's dtype; a quantized cache keeps its own write and gather)."""
        return self.native is not None and type(self.kv) is KVCache and self.kv.dtype == self.dtype

    def _rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return self.native.rms_norm(x, w, self.eps)
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def attention(self, layer: int, q: torch.Tensor, b: ForwardBatch) -> torch.Tensor:
        """q (N, Hq, D) over the cache (already holding this step's K/V) -> (N, Hq * D).

        GQA without repeating K/V: the G query heads of a KV head are folded into the query
        length, so SDPA sees (B, Hkv, G * T, D) against (B, Hkv, L, D).
        """
        hkv, g, d = self.num_kv_heads, self.group, self.head_dim
        outs = []
        if b.num_decode and self._native_cache():
            bd = b.num_decode
            o = self.native.decode_attention(q[:bd], self.kv.k[layer], self.kv.v[layer], b.decode_block_tables, b.decode_lens,
                                             self.kv.block_size, d ** -0.5)
            outs.append(o.view(bd, hkv * g * d))
        elif b.num_decode:
            bd = b.num_decode
            k, v = self.kv.gather(layer, b.decode_block_tables)  # (Bd, L, Hkv, D)
            qd = q[:bd].reshape(bd, hkv, g, d)
            o = F.scaled_dot_product_attention(qd, k.transpose(1, 2), v.transpose(1, 2), attn_mask=b.decode_mask)
            outs.append(o.reshape(bd, hkv * g * d))
        for off, t, table, mask in b.chunks:
            k, v = self.kv.gather(layer, table)  # (1, L, Hkv, D)
            qc = q[off:off + t].reshape(t, hkv, g, d).permute(1, 2, 0, 3).reshape(1, hkv, g * t, d)
            o = F.scaled_dot_product_attention(qc, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
            outs.append(o.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hkv * g * d))
        return outs[0] if len(outs) == 1 else torch.cat(outs)
