"""KV offload tiers: evicted blocks go to host memory and disk and come back on a prefix hit,
exactly; the engine's outputs do not change with the tiers on; files are shared by namespace
and never read half-written; bad settings are refused."""

import gc

import pytest
import torch

from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine
from longhaul.inference.block_manager import BlockManager
from longhaul.inference.kv_cache import KVCache
from longhaul.inference.kv_offload import KVOffload, Offloaded
from longhaul.inference.sampling import SamplingParams
from tests.inference.test_block_manager import Seq
from tests.inference.test_engine import lively

BS = 4


def pool(num_blocks=6):
    kv = KVCache(num_layers=2, num_blocks=num_blocks, block_size=BS, num_kv_heads=1, head_dim=3)
    kv.k.copy_(torch.randn(kv.k.shape, generator=torch.Generator().manual_seed(1)))
    kv.v.copy_(torch.randn(kv.v.shape, generator=torch.Generator().manual_seed(2)))
    return kv


def run(bm, seq):
    hit = bm.match_prefix(seq)
    n = len(seq.token_ids) - len(hit) * BS
    assert bm.can_allocate(seq, hit, n)
    bm.allocate(seq, hit, n)
    seq.num_computed_tokens = len(seq.token_ids)
    bm.cache_blocks(seq)
    return hit


def evict_all(bm):
    """Run unrelated sequences until every block has been handed out again."""
    for i in range(3):
        s = Seq(list(range(1000 + 8 * i, 1008 + 8 * i)) + [1])
        run(bm, s)
        bm.free_blocks(s)


def test_an_evicted_block_comes_back_from_host_memory_with_its_k_v():
    kv = pool()
    off = KVOffload(kv, host_bytes=1 << 20)
    bm = BlockManager(6, BS, offload=off)
    a = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    run(bm, a)
    blocks = list(a.block_table[:2])
    want = [kv.read_block(b) for b in blocks]
    bm.free_blocks(a)
    evict_all(bm)
    b = Seq([1, 2, 3, 4, 5, 6, 7, 8, 10])
    hit = bm.match_prefix(b)
    assert [type(h) for h in hit] == [Offloaded, Offloaded] and {h.tier for h in hit} == {"host"}
    run(bm, b)
    assert b.num_cached_blocks == 2
    for got, exp in zip(b.block_table[:2], want):
        for x, y in zip(kv.read_block(got), exp):
            assert torch.equal(x, y)
    # registered again in the pool: a third sequence hits the pool itself
    assert all(isinstance(h, int) for h in bm.match_prefix(Seq([1, 2, 3, 4, 5, 6, 7, 8, 11])))
    assert off.stats()["kv_offload_host_hits"] == 2 * BS and bm.prefix_cache_hits == 0


def test_the_host_tier_is_bounded_and_spills_to_disk(tmp_path):
    kv = pool()
    off = KVOffload(kv, host_bytes=1, disk_dir=tmp_path, disk_bytes=1 << 20, namespace="ns")
    bm = BlockManager(6, BS, offload=off)
    a = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    run(bm, a)
    want = kv.read_block(a.block_table[0])
    bm.free_blocks(a)
    evict_all(bm)
    assert off.host_used <= off.block_nbytes and len(list((tmp_path / "ns").glob("*.safetensors"))) >= 2
    assert not list((tmp_path / "ns").glob(".*tmp"))  # written to a temporary name, then renamed
    b = Seq([1, 2, 3, 4, 5, 6, 7, 8, 10])
    hit = bm.match_prefix(b)
    assert len(hit) == 2 and hit[0].tier == "disk"
    run(bm, b)
    assert all(torch.equal(x, y) for x, y in zip(kv.read_block(b.block_table[0]), want))


def test_a_second_process_reads_the_same_namespace_and_nothing_else(tmp_path):
    kv = pool()
    writer = BlockManager(6, BS, offload=KVOffload(kv, disk_dir=tmp_path, disk_bytes=1 << 20, namespace="weights-a"))
    a = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    run(writer, a)
    want = kv.read_block(a.block_table[1])
    writer.free_blocks(a)
    evict_all(writer)
    kv2 = pool()
    reader = BlockManager(6, BS, offload=KVOffload(kv2, disk_dir=tmp_path, disk_bytes=1 << 20, namespace="weights-a"))
    other = BlockManager(6, BS, offload=KVOffload(pool(), disk_dir=tmp_path, disk_bytes=1 << 20, namespace="weights-b"))
    b = Seq([1, 2, 3, 4, 5, 6, 7, 8, 10])
    assert len(reader.match_prefix(b)) == 2 and other.match_prefix(Seq(b.token_ids)) == []
    run(reader, b)
    assert all(torch.equal(x, y) for x, y in zip(kv2.read_block(b.block_table[1]), want))


def test_a_file_gone_or_damaged_after_the_match_ends_the_hit(tmp_path):
    kv = pool()
    off = KVOffload(kv, disk_dir=tmp_path, disk_bytes=1 << 20, namespace="ns")
    bm = BlockManager(6, BS, offload=off)
    a = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    run(bm, a)
    bm.free_blocks(a)
    evict_all(bm)
    b = Seq([1, 2, 3, 4, 5, 6, 7, 8, 10])
    hit = bm.match_prefix(b)
    assert len(hit) == 2
    off._path(hit[1].hash).write_bytes(b"not a block")
    bm.allocate(b, hit, len(b.token_ids) - 2 * BS)
    assert b.num_computed_tokens == BS and b.num_cached_blocks == 1  # computes the rest itself
    assert len(b.block_table) == bm.blocks_for(BS + 1)  # the scheduler's one new token, after the shorter hit


def test_the_disk_tier_keeps_its_bound_and_a_private_namespace_goes_with_it(tmp_path):
    kv = pool(num_blocks=4)
    off = KVOffload(kv, disk_dir=tmp_path, disk_bytes=3 * 1024)  # room for a few small blocks only
    bm = BlockManager(4, BS, offload=off)
    for i in range(12):
        s = Seq(list(range(100 * i, 100 * i + 8)) + [1])
        run(bm, s)
        bm.free_blocks(s)
    files = list(off.dir.glob("*.safetensors"))
    assert off.stores >= 8 and 0 < sum(f.stat().st_size for f in files) <= 3 * 1024 and off.disk_used <= 3 * 1024
    private = off.dir
    del bm, off
    gc.collect()
    assert not private.exists()


def test_flush_drops_both_tiers():
    kv = pool()
    bm = BlockManager(6, BS, offload=KVOffload(kv, host_bytes=1 << 20))
    a = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    run(bm, a)
    bm.free_blocks(a)
    evict_all(bm)
    bm.flush()
    assert bm.match_prefix(Seq([1, 2, 3, 4, 5, 6, 7, 8, 10])) == [] and bm.offload.host_used == 0


# ---- the engine ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return lively("tiny-llama")


def turns(tok):
    """An agent's two turns (the second extends the first) and traffic between them."""
    first = tok.encode("system: you are careful. user: fix the failing test, please")
    second = first + tok.encode(" tool: 1 failed. user: go on")
    others = [tok.encode(f"unrelated request {i}, something else entirely") for i in range(6)]
    return first, second, others


def replay(engine, tok):
    first, second, others = turns(tok)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    engine.generate([first], greedy)
    for o in others:
        engine.generate([o], greedy)
    return engine.generate([second], greedy)[0]


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_the_engine_skips_the_prefill_of_an_evicted_prefix_and_its_outputs_do_not_change(tiny, tier, tmp_path):
    model, tok = tiny
    kw = dict(num_kv_blocks=40, block_size=4, adaptive_threads=False)
    ref = replay(LLMEngine(model, tokenizer=tok, **kw), tok)
    tiers = dict(kv_offload_memory_gb=0.01) if tier == "host" else dict(kv_offload_dir=str(tmp_path), kv_offload_disk_gb=0.01)
    eng = LLMEngine(model, tokenizer=tok, **kw, **tiers)
    out = replay(eng, tok)
    s = eng.stats()
    assert out.token_ids == ref.token_ids
    assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(ref.logprobs), atol=1e-5)
    assert s[f"kv_offload_{tier}_hits"] >= len(turns(tok)[0]) // 4 * 4 - 4 and s["kv_offload_stores_total"] > 0


def test_new_weights_leave_the_offloaded_blocks_behind(tiny, tmp_path):
    model, tok = tiny
    eng = LLMEngine(model, tokenizer=tok, num_kv_blocks=40, block_size=4, adaptive_threads=False,
                    kv_offload_dir=str(tmp_path), kv_offload_namespace="shared")
    first, second, others = turns(tok)
    eng.generate([first] + others[:3], SamplingParams(temperature=0, max_tokens=2))
    eng.update_weights({k: v.clone() for k, v in model.state_dict().items()}, version=1)
    assert eng.block_manager.match_prefix(Seq(list(second))) == []
    assert eng.block_manager.offload.dir.name.startswith("private-")


def test_offload_settings_that_cannot_work_are_refused(tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(LonghaulError, match="kv_cache_dtype auto"):
        LLMEngine(model, tokenizer=tok, num_kv_blocks=8, kv_cache_dtype="int8", kv_offload_memory_gb=0.01)
    with pytest.raises(LonghaulError, match="enable_prefix_caching"):
        LLMEngine(model, tokenizer=tok, num_kv_blocks=8, enable_prefix_caching=False, kv_offload_memory_gb=0.01)
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(LonghaulError, match="writable directory"):
        LLMEngine(model, tokenizer=tok, num_kv_blocks=8, kv_offload_dir=str(blocked / "sub"))


def test_a_second_engine_of_the_same_weights_reads_the_first_ones_blocks_from_disk(tiny, tmp_path):
    model, tok = tiny
    kw = dict(num_kv_blocks=40, block_size=4, adaptive_threads=False, kv_offload_dir=str(tmp_path),
              kv_offload_namespace="tiny-llama-lively")
    first, second, others = turns(tok)
    writer = LLMEngine(model, tokenizer=tok, **kw)
    writer.generate([first] + others, SamplingParams(temperature=0, max_tokens=2))
    reader = LLMEngine(model, tokenizer=tok, **kw)
    ref = LLMEngine(model, tokenizer=tok, num_kv_blocks=40, block_size=4, adaptive_threads=False)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    out, want = reader.generate([second], greedy)[0], ref.generate([second], greedy)[0]
    assert out.token_ids == want.token_ids and reader.stats()["kv_offload_disk_hits"] >= 4
