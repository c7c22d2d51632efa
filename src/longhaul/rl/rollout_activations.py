"""A rollout's own forward, kept so the training step need not run it again.

On-policy GRPO samples with the engine holding exactly the policy's fp32 weights, then runs
the policy forward over the same tokens to get log-probs and the autograd graph: the same
matmuls twice. `RolloutActivations` is the engine runner's recorder (`ModelRunner.recorder`):
it keeps every forward's per-layer linear outputs (qkv, o, gate_up, down: 5,184 floats a token
a layer at SmolLM2's shapes) and logits, and finds them again by token content for a
(prompt, completion). `packed_forward.hidden_states(..., stored=...)` then replaces each linear
of the training forward by its recorded output (`StoredLinear`: no matmul forward, the exact
linear backward), recomputing only the cheap ops (norms, RoPE, attention, SwiGLU) under autograd,
and `fused_head` takes the recorded logits; the backward is unchanged.

Equal maths, and checked: `usable(model)` requires the engine in fp32 without quantization,
KV quantization or speculative decoding, and its weights equal to the policy's, tensor by
tensor (`torch.equal`, ~60 ms at 135M parameters); the runner clears the record on every weight
load. A row's activations depend only on the tokens up to it, so rows are matched by content:
a request (one residency: one block table) is used for a sequence only if it holds exactly the
sequence's tokens at every position, a prefix served from the prefix cache taking the rows of
whatever computed those KV slots (tracked slot by slot, as the cache itself is). Anything not
found runs the full forward instead.

Does not own the forward (`packed_forward`), the engine, or when records are dropped (the trainer
calls `clear()` after each step; `load_weights` clears too).
"""

from __future__ import annotations

import torch

from longhaul.models.lora import is_lora
from longhaul.rl.packed_forward import pack_pairs, pack_shared


class RolloutActivations:
    """The recorder of one `ModelRunner`; attach with `attach(engine)`."""

    def __init__(self, runner, max_bytes: int = 2 << 30):
        self.runner, self.max_bytes = runner, max_bytes  # past max_bytes, stop recording until clear()
        cfg = runner.config
        hq, hkv, d = runner.num_heads, runner.num_kv_heads, runner.head_dim
        # a row's recorded outputs: qkv | o | gate_up | down
        self.widths = ((hq + 2 * hkv) * d, cfg.hidden_size, 2 * cfg.intermediate_size, cfg.hidden_size)
        self.num_layers = cfg.num_hidden_layers
        self.capacity = max_bytes // (self.num_layers * sum(self.widths) * 4)  # rows
        # one (capacity, width) tensor per layer and output, rows appended forward by forward:
        # `gather` then reads each straight into the contiguous (N, width) tensor the training
        # forward takes (one copy, not a stack and a per-layer copy). Allocated on first use and
        # kept across `clear()`, so later steps write into memory already paged in.
        self._store: list[list[torch.Tensor]] | None = None
        self.clear()

    @classmethod
    def attach(cls, engine) -> "RolloutActivations | None":
        """Record `engine`'s forwards, or None when they are not the training forward's maths."""
        c = engine.config
        if c.torch_dtype != torch.float32 or c.quantization or c.kv_cache_dtype != "auto" or engine.spec is not None:
            return None
        engine.runner.recorder = rec = cls(engine.runner)
        return rec

    def clear(self) -> None:
        self._steps: list[dict] = []  # a forward: its first row in the store, its logits
        self._owners: dict[int, dict] = {}  # id(block table) -> position -> (step, row) / token / logit row
        self._slots: dict[int, tuple] = {}  # KV slot -> (step, row, token, logit row): what the cache holds now
        self._rows, self.overflow = 0, False

    # ---- recorder hooks (called by ModelRunner.forward) ----------------------------------
    def begin(self, batch) -> None:
        n = batch.input_ids.numel()
        self._cur = None
        if self.overflow or self._rows + n > self.capacity or batch.owners is None:
            self.clear()  # e.g. evaluation between steps: drop all, the trainer falls back to the forward
            self.overflow = True
            return
        if self._store is None:
            self._store = [[torch.empty((self.capacity, w), dtype=torch.float32) for w in self.widths] for _ in range(self.num_layers)]
        k = len(self._steps)
        self._cur = {"first": self._rows, "n": n, "logits": None}
        self._rows += n
        self._steps.append(self._cur)
        ids, slots = batch.input_ids.tolist(), batch.slot_mapping.tolist()
        lrow = {r: j for j, r in enumerate(batch.logits_indices.tolist())}
        bs = self.runner.kv.block_size
        for bt, start, cnt, off in batch.owners:
            e = self._owners.get(id(bt))
            if e is None:  # bt is kept alive in e, so its id stays unique
                e = self._owners[id(bt)] = {"bt": bt, "row": {}, "tok": {}, "logit": {}}
                for p in range(start):  # served from the prefix cache: whatever computed those slots
                    hit = self._slots.get(bt[p // bs] * bs + p % bs)
                    if hit is not None:
                        e["row"][p], e["tok"][p], e["logit"][p] = (hit[0], hit[1]), hit[2], hit[3]
            for t in range(cnt):
                p, r = start + t, off + t
                e["row"][p], e["tok"][p], e["logit"][p] = (k, r), ids[r], ((k, lrow[r]) if r in lrow else None)
                self._slots[slots[r]] = (k, r, ids[r], e["logit"][p])

    def outputs(self, i: int) -> list[torch.Tensor | None]:
        """Where layer i of the forward in progress writes its [qkv, o, gate_up, down] outputs:
        this forward's rows of the store (contiguous (n, width) views), or Nones when it is
        not recorded."""
        if self._cur is None:
            return [None] * 4
        first, n = self._cur["first"], self._cur["n"]
        return [dst[first:first + n] for dst in self._store[i]]

    def logits(self, logits: torch.Tensor) -> None:
        if self._cur is not None:
            self._cur["logits"] = logits.clone()

    # ---- lookup --------------------------------------------------------------------------
    def usable(self, model) -> bool:
        """True when the recorded forwards ran the policy's current weights (compared exactly)."""
        if is_lora(model) or not self._steps or self.overflow:
            return False
        params = dict(model.named_parameters(remove_duplicate=False))  # tied names too (lm_head.weight)
        for name, (dst, r0, r1) in self.runner.targets().items():
            p = params.get(name)
            if p is None or not isinstance(dst, torch.Tensor) or p.dtype != torch.float32 or not torch.equal(dst[r0:r1], p.detach()):
                return False
        return True

    def lookup(self, prompt: list[int], completion: list[int]):
        """(rows, logit rows) as (step, row) pairs: rows for positions 0 .. len-2 of prompt +
        completion, logit rows for the positions predicting each completion token; or None.
        Position q's row and logits come from any request whose tokens at 0 .. q are these
        (a request preempted and recomputed has its rows again, its earlier logits elsewhere)."""
        x = prompt + completion
        last = len(x) - 2
        if not completion or last < 0:
            return None
        agree = []  # (request, number of leading positions whose tokens are x's)
        for e in self._owners.values():
            m = 0
            while m <= last and e["tok"].get(m) == x[m]:
                m += 1
            if m:
                agree.append((e, m))
        agree.sort(key=lambda em: -em[1])  # longest first: one request serves most positions

        def first(kind: str, q: int):
            return next((e[kind][q] for e, m in agree if m > q and e[kind].get(q) is not None), None)

        rows = [first("row", q) for q in range(last + 1)]
        logits = [first("logit", q) for q in range(len(prompt) - 1, last + 1)]
        return None if None in rows or None in logits else (rows, logits)

    def gather(self, rows: list[tuple[int, int]]) -> list[list[torch.Tensor]]:
        """The given rows' recorded outputs, in order: per layer [qkv, o, gate_up, down], each a
        contiguous (n, width) tensor of its own."""
        index = torch.tensor([self._steps[k]["first"] + r for k, r in rows], dtype=torch.long)
        return [[t.index_select(0, index) for t in layer] for layer in self._store]

    def gather_logits(self, rows: list[tuple[int, int]]) -> torch.Tensor:
        """(m, V) float32 logits of the given logit rows, in order."""
        return torch.stack([self._steps[k]["logits"][j] for k, j in rows])

    def batch(self, prompts: list[list[int]], completions: list[list[int]], pad_id: int, shared: bool):
        """(PackedBatch, (activations per layer, logits)) for these sequences in `packed_forward`'s
        layout (`pack_shared` when `shared`: one prompt for all), or None if any is not recorded."""
        found = [self.lookup(p, c) for p, c in zip(prompts, completions)]
        if any(f is None for f in found):
            return None
        if shared:
            P = len(prompts[0])
            rows = found[0][0][:P] + [r for f in found for r in f[0][P:]]
            batch = pack_shared(prompts[0], completions, pad_id)
        else:
            rows = [r for f in found for r in f[0]]
            batch = pack_pairs(list(zip(prompts, completions)), pad_id)
        logits = [r for f in found for r in f[1]]
        assert len(rows) == batch.input_ids.numel() and len(logits) == batch.pick.numel()
        return batch, (self.gather(rows), self.gather_logits(logits))
