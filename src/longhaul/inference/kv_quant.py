"""A paged KV cache holding int8 or int4 codes: `QuantizedKVCache`, a drop-in `KVCache`.

Owns the quantized storage and its full-precision window. Does not own the number formats
(`quant.py`: `KVQuant`, `quantize_kv`, `pack_int4`) or which block belongs to whom.

Layout, per layer: codes (slots, Hkv, D) uint8, or (slots, Hkv, D/2) for int4; per-token
scales and biases (slots, Hkv, D/group) float32; per-channel key scales (blocks, Hkv, D), one
per channel per block (KIVI's token group = the block).

The full-precision window is each sequence's open block. A block is written into a float
staging row (all layers) and read from there until it is complete; the first write of the
next step quantizes it (so a block never holds half codes, and a prefill reads its own chunk in
float). The cache never hears that a block was freed, so staging rows are reclaimed lazily:
when a step needs a row and none is free, an open block not written this step is closed as
it stands (quantized over its filled tokens); only if every open block was written this step
does the staging pool grow. A write that starts inside a closed block (a sequence resumed after
its block was closed, a speculative rollback, a copy-on-write copy) reopens it from its codes:
those tokens are then quantized twice, which at most doubles their rounding error.
"""

from __future__ import annotations

import torch

from longhaul.errors import LonghaulError
from longhaul.inference.kv_cache import KVCache
from longhaul.inference.quant import KVQuant, kv_preset, quantize_kv, unpack_int4


class QuantizedKVCache(KVCache):
    """`KVCache` with int8/int4 storage; `gather` returns `dtype` (float32 by default)."""

    offloadable = False  # a block's codes live in rows and staging buffers, not one slice

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", fmt: KVQuant | str = "int8",
                 staging_blocks: int = 16):
        fmt = kv_preset(fmt) if isinstance(fmt, str) else fmt
        if fmt.residual:
            raise LonghaulError("the paged KV cache keeps the open block in full precision, not a token residual; use residual=0")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim, self.dtype, self.fmt = num_kv_heads, head_dim, dtype, fmt
        if fmt.v_axis != "token":
            raise LonghaulError("the paged KV cache quantizes values per token; set v_axis='token'")
        # channels a per-token scale spans, at most the head (a preset's 32 on a 16-wide tiny head)
        self.k_group = block_size if fmt.k_axis == "channel" else min(fmt.k_group or head_dim, head_dim)
        self.v_group = min(fmt.v_group or head_dim, head_dim)
        for name, g in (("k_group", self.k_group if fmt.k_axis == "token" else head_dim), ("v_group", self.v_group)):
            if head_dim % g:
                raise LonghaulError(f"{name} {g} must divide head_dim {head_dim}")
        slots, h, w = num_blocks * block_size, num_kv_heads, head_dim if fmt.bits == 8 else head_dim // 2
        z = lambda *s, dt=torch.float32: torch.zeros(s, dtype=dt, device=device)  # noqa: E731
        self.kc, self.vc = z(num_layers, slots, h, w, dt=torch.uint8), z(num_layers, slots, h, w, dt=torch.uint8)
        kscale_rows = num_blocks if fmt.k_axis == "channel" else slots
        kscale_cols = head_dim if fmt.k_axis == "channel" else head_dim // self.k_group
        self.ks, self.kb = z(num_layers, kscale_rows, h, kscale_cols), z(num_layers, kscale_rows, h, kscale_cols)
        self.vs, self.vb = z(num_layers, slots, h, head_dim // self.v_group), z(num_layers, slots, h, head_dim // self.v_group)
        # the window: staging rows (L, rows, block, Hkv, D) in `dtype`, block -> row or -1
        staging_blocks = max(1, min(staging_blocks, num_blocks))
        self.sk = z(num_layers, staging_blocks, block_size, h, head_dim, dt=dtype)
        self.sv = torch.zeros_like(self.sk)
        self.row = torch.full((num_blocks,), -1, dtype=torch.long, device=device)
        self.filled = [0] * num_blocks  # tokens written into each block (its highest offset + 1)
        self.last_step = [0] * num_blocks
        self.free_rows = list(range(staging_blocks - 1, -1, -1))
        self.step = 0

    def storage(self) -> list[torch.Tensor]:
        return [self.kc, self.vc, self.ks, self.kb, self.vs, self.vb, self.sk, self.sv]

    @classmethod
    def bytes_per_token(cls, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32,
                        fmt: KVQuant | str = "int8", block_size: int = 16) -> int:
        """Bytes of one token's K and V codes and scales over all layers (the staging window aside)."""
        fmt = kv_preset(fmt) if isinstance(fmt, str) else fmt
        codes = 2 * head_dim * fmt.bits // 8
        k_aff = 8 * head_dim / block_size if fmt.k_axis == "channel" else 8 * head_dim // (fmt.k_group or head_dim)
        v_aff = 8 * head_dim // (fmt.v_group or head_dim)
        return int(num_layers * num_kv_heads * (codes + k_aff + v_aff) + 0.5)

    # ---- codes <-> floats ----------------------------------------------------------------
    def _encode(self, x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., Hkv, D) per token -> codes (..., Hkv, W), scale and bias (..., Hkv, D/group)."""
        q = quantize_kv(x, self.fmt.bits, "token", group, self.fmt.symmetric)
        return q.codes, q.scale.squeeze(-1), q.bias.squeeze(-1)

    def _decode(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, group: int | None) -> torch.Tensor:
        """codes (..., Hkv, W) with per-token (..., Hkv, D/group) or, for group None, per-channel
        scales broadcastable to (..., Hkv, D) -> (..., Hkv, D) in `dtype`."""
        c = (unpack_int4(codes) if self.fmt.bits == 4 else codes).float()
        if group is None:
            return torch.addcmul(bias, c, scale).to(self.dtype)
        cg = c.unflatten(-1, (-1, group))
        return torch.addcmul(bias[..., None], cg, scale[..., None]).flatten(-2).to(self.dtype)

    def _slots(self, blocks: torch.Tensor) -> torch.Tensor:
        return (blocks[:, None] * self.block_size + torch.arange(self.block_size, device=blocks.device)).reshape(-1)

    def _close(self, blocks: list[int]) -> None:
        """Quantize open blocks from staging (every layer) and free their rows."""
        if not blocks:
            return
        bs, dev = self.block_size, self.row.device
        b = torch.tensor(blocks, device=dev)
        rows, slots = self.row[b], self._slots(b)
        k, v = self.sk[:, rows], self.sv[:, rows]  # (L, M, bs, Hkv, D)
        codes, s, z = self._encode(v.flatten(1, 2), self.v_group)
        self.vc.index_copy_(1, slots, codes), self.vs.index_copy_(1, slots, s), self.vb.index_copy_(1, slots, z)
        if self.fmt.k_axis == "token":
            codes, s, z = self._encode(k.flatten(1, 2), self.k_group)
            self.kc.index_copy_(1, slots, codes), self.ks.index_copy_(1, slots, s), self.kb.index_copy_(1, slots, z)
        else:  # one scale per channel over the block's filled tokens
            for j, blk in enumerate(blocks):
                f = self.filled[blk] or bs
                q = quantize_kv(k[:, j, :f].transpose(1, 2), self.fmt.bits, "channel", f, self.fmt.symmetric)
                codes = q.codes.transpose(1, 2)  # (L, f, Hkv, W)
                self.kc[:, blk * bs:blk * bs + f] = codes
                self.ks[:, blk], self.kb[:, blk] = q.scale[:, :, 0, 0], q.bias[:, :, 0, 0]
        self.free_rows += rows.tolist()
        self.row[b] = -1

    def _reopen(self, blk: int, row: int) -> None:
        """Load a closed block's tokens back into staging row `row` (every layer)."""
        sl = slice(blk * self.block_size, (blk + 1) * self.block_size)
        self.sv[:, row] = self._decode(self.vc[:, sl], self.vs[:, sl], self.vb[:, sl], self.v_group)
        if self.fmt.k_axis == "token":
            self.sk[:, row] = self._decode(self.kc[:, sl], self.ks[:, sl], self.kb[:, sl], self.k_group)
        else:
            self.sk[:, row] = self._decode(self.kc[:, sl], self.ks[:, blk, None], self.kb[:, blk, None], None)

    def _take_row(self) -> int:
        if not self.free_rows:
            stale = [b for b in torch.nonzero(self.row >= 0).flatten().tolist() if self.last_step[b] < self.step]
            if stale:
                self._close(sorted(stale, key=lambda b: self.last_step[b])[: max(1, len(stale) // 2)])
            else:  # every open block is in use this step: grow the window
                n = self.sk.shape[1]
                with torch.inference_mode(False):  # a normal tensor, writable outside the engine's step too
                    self.sk = torch.cat((self.sk, torch.zeros_like(self.sk)), 1)
                    self.sv = torch.cat((self.sv, torch.zeros_like(self.sv)), 1)
                self.free_rows += list(range(2 * n - 1, n - 1, -1))
        return self.free_rows.pop()

    def _open(self, slot_mapping: torch.Tensor) -> None:
        """Start of a step (layer 0): close complete blocks, give every written block a row."""
        self.step += 1
        bs = self.block_size
        self._close([b for b in torch.nonzero(self.row >= 0).flatten().tolist() if self.filled[b] >= bs])
        blocks, offs = (slot_mapping // bs).tolist(), (slot_mapping % bs).tolist()
        first, last = {}, {}
        for b, o in zip(blocks, offs):
            first[b], last[b] = min(first.get(b, o), o), max(last.get(b, o), o)
        for b in first:  # before any row is taken, so that no block of this step is closed for room
            self.last_step[b] = self.step
        for b in first:
            if self.row[b] < 0:
                row = self._take_row()
                self.row[b] = row
                if first[b] > 0:  # continuing a closed block: its earlier tokens come back from codes
                    self._reopen(b, row)
                else:  # a fresh block (offset 0 written): whatever it held before is dead
                    self.filled[b] = 0
            self.filled[b] = max(self.filled[b], last[b] + 1)

    # ---- the KVCache interface -----------------------------------------------------------
    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (N, Hkv, D) of N new tokens at slots (N,) of `layer`, in full precision
        until their block is complete. Layers are written in order each step, layer 0 first."""
        if layer == 0:
            self._open(slot_mapping)
        bs = self.block_size
        rows = self.row[slot_mapping // bs]
        if bool((rows < 0).any()):
            raise LonghaulError("quantized KV cache written out of order: write layer 0 first in every step")
        offs = slot_mapping % bs
        self.sk[layer, rows, offs] = k.to(self.dtype)
        self.sv[layer, rows, offs] = v.to(self.dtype)

    def gather(self, layer: int, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """block_tables (B, nb) -> k, v (B, nb * block_size, Hkv, D) in `dtype`: closed blocks
        dequantized, open blocks from staging."""
        b, nb = block_tables.shape
        bs, h, d = self.block_size, self.num_kv_heads, self.head_dim
        flat = block_tables.reshape(-1)
        blocks = lambda t: t[layer].view(self.num_blocks, bs, *t.shape[2:]).index_select(0, flat)  # noqa: E731  (B * nb, bs, ...)
        v = self._decode(blocks(self.vc), blocks(self.vs), blocks(self.vb), self.v_group)
        if self.fmt.k_axis == "token":
            k = self._decode(blocks(self.kc), blocks(self.ks), blocks(self.kb), self.k_group)
        else:  # codes (B * nb, bs, Hkv, W) against one scale row per block (B * nb, 1, Hkv, D)
            k = self._decode(blocks(self.kc), self.ks[layer, flat, None], self.kb[layer, flat, None], None)
        k, v = k.view(b * nb, bs, h, d), v.view(b * nb, bs, h, d)
        rows = self.row[flat]
        live = torch.nonzero(rows >= 0).flatten()
        if len(live):
            k[live], v[live] = self.sk[layer, rows[live]], self.sv[layer, rows[live]]
        return k.view(b, nb * bs, h, d), v.view(b, nb * bs, h, d)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block (codes, scales and, if open, its staging row) in every layer."""
        bs = self.block_size
        s, t = slice(src * bs, (src + 1) * bs), slice(dst * bs, (dst + 1) * bs)
        for a in (self.kc, self.vc, self.vs, self.vb) + ((self.ks, self.kb) if self.fmt.k_axis == "token" else ()):
            a[:, t] = a[:, s]
        if self.fmt.k_axis == "channel":
            self.ks[:, dst], self.kb[:, dst] = self.ks[:, src], self.kb[:, src]
        src_row, dst_row = int(self.row[src]), int(self.row[dst])
        if dst_row >= 0 and src_row < 0:
            self.free_rows.append(dst_row)
            self.row[dst] = -1
        if src_row >= 0:
            if dst_row < 0:
                dst_row = self._take_row()
                self.row[dst] = dst_row
            self.sk[:, dst_row], self.sv[:, dst_row] = self.sk[:, src_row], self.sv[:, src_row]
        self.filled[dst], self.last_step[dst] = self.filled[src], self.last_step[src]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kc, self.vc, self.ks, self.kb, self.vs, self.vb, self.sk, self.sv))


def make_kv_cache(kv_cache_dtype: str, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                  head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> KVCache:
    """The engine's cache for `kv_cache_dtype` ("auto": float in the model's dtype, "int8", "int4")."""
    if kv_cache_dtype == "auto":
        return KVCache(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device)
    return QuantizedKVCache(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device, fmt=kv_preset(kv_cache_dtype))


def kv_bytes_per_token(kv_cache_dtype: str, num_layers: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype = torch.float32, block_size: int = 16) -> int:
    """Bytes a token takes in the cache `make_kv_cache` builds: sizes the pool from a memory budget."""
    if kv_cache_dtype == "auto":
        return KVCache.bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
    return QuantizedKVCache.bytes_per_token(num_layers, num_kv_heads, head_dim, dtype, kv_cache_dtype, block_size)
