"""Block manager: ref counts, chained hashes, prefix hits, eviction order, truncation."""

from dataclasses import dataclass, field

import pytest

from longhaul.inference.block_manager import BlockManager, chain_hash


@dataclass
class Seq:
    token_ids: list[int]
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0


def run(bm: BlockManager, seq: Seq) -> list[int]:
    """Admit seq with its prefix hit, compute all its tokens, register its blocks."""
    hit = bm.match_prefix(seq)
    n = len(seq.token_ids) - len(hit) * bm.block_size
    assert bm.can_allocate(seq, hit, n)
    bm.allocate(seq, hit, n)
    seq.num_computed_tokens = len(seq.token_ids)
    bm.cache_blocks(seq)
    return hit


def test_hashes_chain_over_the_whole_prefix():
    bm = BlockManager(8, 2)
    a, b = Seq([1, 2, 3, 4, 5]), Seq([9, 9, 3, 4, 5])
    ha, hb = bm.block_hashes(a), bm.block_hashes(b)
    assert len(ha) == 2  # only full blocks
    assert ha[0] == chain_hash(None, (1, 2)) and ha[1] == chain_hash(ha[0], (3, 4))
    assert ha[1] != hb[1]  # same block tokens, different prefix


def test_ref_counts_and_sharing_a_prefix():
    bm = BlockManager(8, 2)
    a = Seq([1, 2, 3, 4, 5])
    assert run(bm, a) == [] and bm.num_free_blocks == 5
    b = Seq([1, 2, 3, 4, 6, 7])
    hit = run(bm, b)
    assert hit == a.block_table[:2] and b.block_table[:2] == a.block_table[:2]
    assert [bm.blocks[i].ref_count for i in hit] == [2, 2]
    assert bm.prefix_cache_queries == 11 and bm.prefix_cache_hits == 4
    bm.free_blocks(a)
    assert [bm.blocks[i].ref_count for i in hit] == [1, 1] and bm.num_free_blocks == 5
    bm.free_blocks(b)
    assert bm.num_free_blocks == 8 and bm.usage() == 0.0


def test_a_hit_leaves_the_last_token_to_compute():
    bm = BlockManager(8, 2)
    run(bm, Seq([1, 2, 3, 4]))
    again = Seq([1, 2, 3, 4])
    assert bm.match_prefix(again) == bm.match_prefix(Seq([1, 2, 3, 4, 8]))[:1]


def test_freed_cached_blocks_stay_hittable_until_evicted_lru():
    bm = BlockManager(4, 2)
    a = Seq([1, 2, 3, 4, 5])  # 3 blocks, the first two full and cached
    run(bm, a)
    full, partial = a.block_table[:2], a.block_table[2]
    bm.free_blocks(a)
    # the partial block caches nothing and is reused first; the cached tail goes out before the head
    assert list(bm.free) == [partial, 3, full[1], full[0]]
    assert bm.match_prefix(Seq([1, 2, 3, 4, 9])) == full
    c = Seq([7, 7])
    run(bm, c)
    assert c.block_table == [partial]
    d = Seq([8, 8, 8, 8, 8, 8])  # 3 blocks: evicts both cached ones
    bm.allocate(d, [], 6)
    assert d.block_table == [3, full[1], full[0]]
    assert bm.match_prefix(Seq([1, 2, 3, 4, 9])) == []  # evicted and forgotten


def test_eviction_order_keeps_the_prefix_longest():
    bm = BlockManager(5, 2)
    a = Seq([1, 2, 3, 4, 5, 6])
    run(bm, a)
    table = list(a.block_table)
    bm.free_blocks(a)
    run(bm, Seq([7, 7, 7, 7]))  # the two never-used blocks: no eviction yet
    run(bm, Seq([8, 8]))  # evicts a's last block (5, 6), keeps (1, 2) and (3, 4)
    assert bm.match_prefix(Seq([1, 2, 3, 4, 5, 6, 0])) == table[:2]


def test_cannot_allocate_more_than_free():
    bm = BlockManager(3, 4)
    s = Seq(list(range(13)))
    assert not bm.can_allocate(s, [], 13)
    assert bm.can_allocate(s, [], 12)
    bm.allocate(s, [], 12)
    s.num_computed_tokens = 12
    assert not bm.can_append(s, 1) and bm.can_append(Seq([1]), 0)
    with pytest.raises(RuntimeError, match="no free KV block"):
        bm.append(s, 1)


def test_truncate_frees_whole_blocks_and_unshares_a_partial_cached_block():
    bm = BlockManager(8, 2)
    a, b = Seq([1, 2, 3, 4, 5, 6]), Seq([1, 2, 3, 4, 5, 6, 7])
    run(bm, a)
    run(bm, b)  # shares a's three full blocks (the hit stops one token short of 7 tokens: all 3)
    assert b.block_table[:3] == a.block_table
    copies = bm.truncate(b, 3)  # keep tokens 0..2: block 1 becomes partial and is shared
    assert len(b.block_table) == 2 and b.num_computed_tokens == 3
    assert copies == [(a.block_table[1], b.block_table[1])] and b.block_table[1] != a.block_table[1]
    assert bm.blocks[a.block_table[1]].ref_count == 1 and bm.blocks[a.block_table[2]].ref_count == 1
    bm.free_blocks(b)
    assert bm.truncate(a, 3) == []  # a alone holds it: just forgotten, written in place later
    assert bm.blocks[a.block_table[1]].hash is None and len(a.block_table) == 2
    assert bm.match_prefix(Seq([1, 2, 3, 4, 0])) == a.block_table[:1]


def test_flush_forgets_every_prefix():
    bm = BlockManager(4, 2)
    run(bm, Seq([1, 2, 3]))
    bm.flush()
    assert bm.match_prefix(Seq([1, 2, 3])) == [] and not bm.cached


def test_prefix_caching_off_never_hits():
    bm = BlockManager(4, 2, enable_prefix_caching=False)
    run(bm, Seq([1, 2, 3]))
    assert run(bm, Seq([1, 2, 3])) == [] and bm.prefix_cache_queries == 0
