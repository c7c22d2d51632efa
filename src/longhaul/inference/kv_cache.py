"""The paged KV pool: one preallocated tensor of blocks per layer for keys and one for values.

Owns the storage and the two ways into it: `write` (scatter a step's new keys and values to
their slots) and `gather` (a batch of sequences' blocks as padded, contiguous-in-position
keys and values for attention). A slot is `block_id * block_size + offset`. Does not own which
block belongs to whom (`block_manager`) or attention itself (`model_runner`).

A quantized KV cache (`quant.py`) subclasses `KVCache` and overrides `write`, `gather`,
`copy_block` and `bytes_per_token`; nothing else touches the storage.
"""

from __future__ import annotations

import torch

from longhaul.malloc import discard


class KVCache:
    """Keys and values of `num_layers` layers in `num_blocks` blocks of `block_size` tokens.

    Storage is (num_layers, num_blocks * block_size, num_kv_heads, head_dim) for K and for V,
    zero-filled: the padding that `gather` returns past a sequence's end is masked out of
    attention, and zeros (unlike uninitialised memory) can never be NaN, which a zero
    attention weight would still propagate.
    """

    offloadable = True  # a block's K/V is a plain slice: `read_block` / `write_block` move it whole

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one token's K and V take over all layers: sizes the pool from a memory budget."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (N, Hkv, D) of N new tokens at slots (N,) of `layer`."""
        self.k[layer].index_copy_(0, slot_mapping, k.to(self.dtype))
        self.v[layer].index_copy_(0, slot_mapping, v.to(self.dtype))

    def gather(self, layer: int, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """block_tables (B, nb) -> k, v (B, nb * block_size, Hkv, D): each row's blocks in order.

        Rows shorter than nb blocks are padded with any valid block id; the caller masks
        positions past each row's context length.
        """
        b, nb = block_tables.shape
        flat = block_tables.reshape(-1)
        shape = (b, nb * self.block_size, self.num_kv_heads, self.head_dim)
        k = self.k[layer].view(self.num_blocks, -1).index_select(0, flat).view(shape)
        v = self.v[layer].view(self.num_blocks, -1).index_select(0, flat).view(shape)
        return k, v

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's keys and values in every layer (copy-on-write when a shared,
        cached block must be written by one of its holders)."""
        bs = self.block_size
        self.k[:, dst * bs:(dst + 1) * bs] = self.k[:, src * bs:(src + 1) * bs]
        self.v[:, dst * bs:(dst + 1) * bs] = self.v[:, src * bs:(src + 1) * bs]

    def read_block(self, block_id: int) -> list[torch.Tensor]:
        """A copy of one block's keys and values in every layer (the offload tier keeps it)."""
        bs = self.block_size
        return [t[:, block_id * bs:(block_id + 1) * bs].clone() for t in (self.k, self.v)]

    def write_block(self, block_id: int, data: list[torch.Tensor]) -> None:
        """Put back what `read_block` returned, into block `block_id`."""
        bs = self.block_size
        for t, d in zip((self.k, self.v), data):
            t[:, block_id * bs:(block_id + 1) * bs] = d

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def storage(self) -> list[torch.Tensor]:
        """The tensors that hold keys and values (not the bookkeeping of which block is where)."""
        return [self.k, self.v]

    def discard(self) -> int:
        """Hand the pool's memory pages back to the OS while it stays allocated (`malloc.discard`):
        for an engine with no sequences, whose blocks' content no longer matters. The pages
        fault back in, zero-filled, as the next sequences write them; the few bytes on pages
        shared with other allocations are zeroed here, so unwritten slots stay zeros. Returns
        the bytes handed back."""
        freed = 0
        for t in self.storage():
            if t.device.type != "cpu" or not t.numel():
                continue
            storage = t.untyped_storage()
            lo, hi = discard(storage.data_ptr(), storage.nbytes())
            raw = torch.empty(0, dtype=torch.uint8).set_(storage)
            raw[:lo].zero_()
            raw[max(lo, hi):].zero_()
            freed += hi - lo
        return freed
