"""KV blocks: who holds which block, and the prefix cache over them.

Owns the block pool's bookkeeping (ref counts, the free queue, each sequence's block table)
and prefix caching: a full block is keyed by a hash chained over every token before it
(`hash((parent_hash, block_tokens))`), so one key names a whole prefix; a new sequence takes
the longest run of cached blocks that starts its tokens. Does not own the K/V tensors
(`kv_cache`) or the decision of who runs (`scheduler`).

As in vLLM v1, a block whose last holder leaves stays in the hash table with ref count 0 and
sits in the free queue; it is evicted (its hash forgotten) only when the queue hands it out
again. The queue is LRU: freed blocks join at the back, a sequence's tail first so its
prefix survives longest; blocks that cache nothing join at the front and are reused first.
A hit checks the block's tokens as well as the hash, so only a collision of the chain hash
itself (64-bit) could alias two prefixes. The hit stops one token short of the sequence's
end: the last token must be computed to produce logits.

With an offload tier (`kv_offload.KVOffload`), an evicted block's K/V is copied there before
the block is reused, and a prefix match that runs past the pool's cached blocks goes on in the
tier: `match_prefix` returns pool block ids and `Offloaded` entries in prefix order, and
`allocate` brings the offloaded ones back into fresh blocks, registered in the cache as if
computed here. A hit that has gone from disk by then (another process's file) ends the hit.

Cache statistics are in tokens, as vLLM's `prefix_cache_queries` / `prefix_cache_hits` (the
pool's hits; the tiers count theirs).
"""

from __future__ import annotations

from collections import OrderedDict

from longhaul.inference.kv_offload import KVOffload, Offloaded

_ROOT = 0x6C6F6E67  # the parent of a sequence's first block (hash(None) is not the same in every process)


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id, self.ref_count = block_id, 0
        self.hash: int | None = None  # set once the block is full and registered
        self.token_ids: tuple[int, ...] = ()


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """The key of a block: its tokens and every token before it (parent: the previous block's
    key). Integers and tuples of them hash alike in every process, so keys name blocks on disk."""
    return hash((_ROOT if parent is None else parent, token_ids))


class BlockManager:
    """Blocks of `block_size` tokens; a sequence's `block_table` lists its blocks in order.

    Sequences are duck-typed: `token_ids`, `num_computed_tokens`, `block_table`,
    `block_hashes` (the chain of its full blocks, filled here) and `num_cached_blocks` (how
    many of its blocks are registered in the cache).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 offload: KVOffload | None = None):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.offload = offload if enable_prefix_caching else None
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # ref count 0, front = next out
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    # ---- accounting ----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        """Fraction of blocks held by a sequence (cached but unheld blocks count as free)."""
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ----------------------------------------------------------------------
    def block_hashes(self, seq) -> list[int]:
        """Extend and return the chain hashes of seq's full blocks."""
        bs, hashes = self.block_size, seq.block_hashes
        for i in range(len(hashes), len(seq.token_ids) // bs):
            parent = hashes[-1] if hashes else getattr(seq, "cache_root", None)
            hashes.append(chain_hash(parent, tuple(seq.token_ids[i * bs:(i + 1) * bs])))
        return hashes

    def match_prefix(self, seq) -> list[int | Offloaded]:
        """Cached blocks that hold a prefix of seq's tokens (not yet taken): pool block ids, and
        with an offload tier its `Offloaded` entries. `allocate` counts the lookup, so a request
        that must wait is not counted twice."""
        if not self.enable_prefix_caching:
            return []
        bs, hit = self.block_size, []
        for i, h in enumerate(self.block_hashes(seq)[:(len(seq.token_ids) - 1) // bs]):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            bid = self.cached.get(h)
            if bid is not None and self.blocks[bid].token_ids == tokens:
                hit.append(bid)
                continue
            held = self.offload.find(h, tokens) if self.offload is not None else None
            if held is None:
                break
            hit.append(held)
        return hit

    def cache_blocks(self, seq) -> None:
        """Register seq's blocks that are full and computed, so later sequences can share them
        (not those of a sequence whose K/V spans a weight update: `kv_stale`)."""
        if not self.enable_prefix_caching or getattr(seq, "kv_stale", False):
            return
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_cached_blocks:
            return
        hashes, bs = self.block_hashes(seq), self.block_size
        for i in range(seq.num_cached_blocks, full):
            blk = self.blocks[seq.block_table[i]]
            if blk.hash is None:
                blk.hash, blk.token_ids = hashes[i], tuple(seq.token_ids[i * bs:(i + 1) * bs])
                self.cached.setdefault(blk.hash, blk.block_id)
        seq.num_cached_blocks = full

    def flush(self, namespace: str | None = None) -> None:
        """Forget every cached prefix, the offload tier's too (after a weight update, their K/V
        are stale; the tier's later blocks go to `namespace`)."""
        if self.offload is not None:
            self.offload.flush(namespace)
        self.cached.clear()
        for blk in self.blocks:
            blk.hash, blk.token_ids = None, ()

    # ---- allocate / free -----------------------------------------------------------------
    def can_allocate(self, seq, hit: list[int | Offloaded], num_new_tokens: int) -> bool:
        """Room for a waiting seq to hold its `hit` blocks plus num_new_tokens after them
        (offloaded hits come back into fresh blocks)."""
        pool = [b for b in hit if isinstance(b, int)]
        need = self.blocks_for(len(hit) * self.block_size + num_new_tokens) - len(pool)
        unheld_hits = sum(1 for b in pool if self.blocks[b].ref_count == 0)  # taken out of the free queue
        return need <= len(self.free) - unheld_hits

    def allocate(self, seq, hit: list[int | Offloaded], num_new_tokens: int) -> None:
        """Give a waiting seq its cached prefix blocks (bringing offloaded ones back) and fresh
        blocks for num_new_tokens."""
        data = {}
        for i, b in enumerate(hit):
            if isinstance(b, Offloaded):
                data[i] = self.offload.fetch(b)
                if data[i] is None:  # gone from disk since the match: the hit ends here
                    hit = hit[:i]
                    break
        pool = sum(isinstance(b, int) for b in hit)
        if self.enable_prefix_caching:
            self.prefix_cache_queries += len(seq.token_ids)
            self.prefix_cache_hits += pool * self.block_size
        for b in hit:
            if isinstance(b, int):
                self._take(b)
        table = [b if isinstance(b, int) else self._restore(b, data[i]) for i, b in enumerate(hit)]
        fresh = self.blocks_for(len(hit) * self.block_size + num_new_tokens) - len(hit)
        seq.block_table = table + [self._pop_free() for _ in range(fresh)]
        seq.num_computed_tokens = len(hit) * self.block_size
        seq.num_cached_blocks = len(hit)
        seq.kv_stale = False  # what it computes from here is under one set of weights

    def can_append(self, seq, num_new_tokens: int) -> bool:
        return self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table) <= len(self.free)

    def append(self, seq, num_new_tokens: int) -> None:
        """Grow a running seq's table to hold num_new_tokens more tokens."""
        for _ in range(self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)):
            seq.block_table.append(self._pop_free())

    def free_blocks(self, seq) -> None:
        """Release all of seq's blocks (finished, aborted or preempted); its K/V is forgotten."""
        for b in reversed(seq.block_table):
            self._release(b)
        seq.block_table, seq.num_computed_tokens, seq.num_cached_blocks = [], 0, 0

    def truncate(self, seq, num_tokens: int) -> list[tuple[int, int]]:
        """Keep the K/V of seq's first num_tokens tokens only (speculative decoding rolls back
        rejected drafts). Frees whole blocks past the new end. A cached block that becomes
        partial is unregistered if seq alone holds it, else replaced by a private copy: the
        returned (src, dst) pairs must be copied in the KV cache before the next write."""
        keep, bs, copies = self.blocks_for(num_tokens), self.block_size, []
        for b in reversed(seq.block_table[keep:]):
            self._release(b)
        del seq.block_table[keep:]
        seq.num_computed_tokens = min(seq.num_computed_tokens, num_tokens)
        seq.num_cached_blocks = min(seq.num_cached_blocks, num_tokens // bs)
        del seq.block_hashes[num_tokens // bs:]
        if num_tokens % bs and seq.block_table:
            last = self.blocks[seq.block_table[-1]]
            if last.hash is not None and last.ref_count == 1:
                self._forget(last)
            elif last.hash is not None:
                new = self._pop_free()
                copies.append((last.block_id, new))
                self._release(last.block_id)
                seq.block_table[-1] = new
        return copies

    # ---- internals -----------------------------------------------------------------------
    def _pop_free(self) -> int:
        if not self.free:
            raise RuntimeError("no free KV block; the scheduler must check can_allocate/can_append first")
        bid, _ = self.free.popitem(last=False)
        blk = self.blocks[bid]
        if self.offload is not None and blk.hash is not None and self.cached.get(blk.hash) == bid:
            self.offload.put(blk.hash, blk.token_ids, bid)  # evicted: its K/V goes down a tier
        self._forget(blk)
        self.blocks[bid].ref_count = 1
        return bid

    def _restore(self, hit: Offloaded, data) -> int:
        """A fresh block holding an offloaded hit's K/V, registered in the cache."""
        bid = self._pop_free()
        self.offload.load(bid, data)
        blk = self.blocks[bid]
        blk.hash, blk.token_ids = hit.hash, hit.token_ids
        self.cached[hit.hash] = bid
        return bid

    def _take(self, bid: int) -> None:
        blk = self.blocks[bid]
        if blk.ref_count == 0:
            del self.free[bid]
        blk.ref_count += 1

    def _release(self, bid: int) -> None:
        blk = self.blocks[bid]
        blk.ref_count -= 1
        if blk.ref_count == 0:
            self.free[bid] = None
            if blk.hash is None:
                self.free.move_to_end(bid, last=False)

    def _forget(self, blk: Block) -> None:
        if blk.hash is not None and self.cached.get(blk.hash) == blk.block_id:
            del self.cached[blk.hash]
        blk.hash, blk.token_ids = None, ()
