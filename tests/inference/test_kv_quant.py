"""`QuantizedKVCache` against the float `KVCache`, and the model runner on it.

Stated tolerances: the open block reads back exactly; closed blocks within the rounding bound
(int8 < 1%, int4 < 15% relative); the model runner (tiny-llama, greedy, 3 sequences of 7-40
prompt tokens then 40 decode steps, teacher-forced on the fp32-cache tokens) keeps its logits
within 1% (int8) and 5% (int4) relative of the fp32 cache, with the same greedy tokens.
"""

from __future__ import annotations

import pytest
import torch

from longhaul.errors import LonghaulError
from longhaul.inference.kv_cache import KVCache
from longhaul.inference.kv_quant import QuantizedKVCache, kv_bytes_per_token, make_kv_cache
from longhaul.inference.model_runner import BatchItem, ModelRunner
from longhaul.inference.quant import KVQuant, quantize_linear
from longhaul.models import load_policy

L, NB, BS, H, D = 2, 16, 4, 2, 16


def rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


class Pair:
    """A float and a quantized cache fed the same writes."""

    def __init__(self, fmt, **kw):
        self.ref, self.q = KVCache(L, NB, BS, H, D), QuantizedKVCache(L, NB, BS, H, D, fmt=fmt, **kw)
        self.gen = torch.Generator().manual_seed(0)

    def write(self, slots: list[int]):
        sm = torch.tensor(slots)
        for layer in range(L):
            k = torch.randn(len(slots), H, D, generator=self.gen) + torch.linspace(-3, 3, D)  # offset channels
            v = torch.randn(len(slots), H, D, generator=self.gen)
            self.ref.write(layer, sm, k, v)
            self.q.write(layer, sm, k, v)

    def gather(self, table: list[int], length: int, layer: int = 0):
        bt = torch.tensor([table])
        (kr, vr), (kq, vq) = self.ref.gather(layer, bt), self.q.gather(layer, bt)
        return kr[0, :length], vr[0, :length], kq[0, :length], vq[0, :length]


def seq_slots(table, start, n):
    return [table[p // BS] * BS + p % BS for p in range(start, start + n)]


@pytest.mark.parametrize("fmt,tol", [("int8", 0.01), ("int4", 0.15)])
def test_open_block_exact_closed_blocks_within_bound(fmt, tol):
    p, table = Pair(fmt), [5, 2, 9]
    p.write(seq_slots(table, 0, 6))  # prefill: block 5 complete, block 2 half
    kr, vr, kq, vq = p.gather(table, 6)
    assert torch.equal(kq, kr) and torch.equal(vq, vr), "a step reads its own writes in float"
    for pos in range(6, 11):  # decode: block 5 closes on the next step, block 2 on the one after it fills
        p.write(seq_slots(table, pos, 1))
    kr, vr, kq, vq = p.gather(table, 11)
    assert torch.equal(kq[8:], kr[8:]) and torch.equal(vq[8:], vr[8:]), "open block 9 stays float"
    assert 0 < rel(kq[:8], kr[:8]) < tol and 0 < rel(vq[:8], vr[:8]) < tol, (rel(kq[:8], kr[:8]), rel(vq[:8], vr[:8]))


def test_int4_per_channel_keys_beat_per_token_keys_on_offset_channels():
    errs = {}
    for axis in ("token", "channel"):
        p, table = Pair(KVQuant(4, k_axis=axis)), [1, 2, 3, 4]
        p.write(seq_slots(table, 0, 12))
        p.write(seq_slots(table, 12, 1))  # closes all three blocks
        kr, _, kq, _ = p.gather(table, 12)
        errs[axis] = rel(kq, kr)
    assert errs["channel"] < errs["token"], errs


def test_window_grows_when_every_open_block_is_in_use_and_recycles_stale_ones():
    p = Pair("int8", staging_blocks=1)
    tables = [[0, 1], [2, 3], [4, 5]]
    p.write([seq_slots(t, 0, 1)[0] for t in tables])  # three sequences in one step
    assert p.q.sk.shape[1] == 4 and int((p.q.row >= 0).sum()) == 3
    p.write(seq_slots(tables[0], 1, 1))  # only sequence 0 runs: the others' rows may be reclaimed
    p.write(seq_slots([6, 7], 0, 1) + seq_slots([8, 9], 0, 1))  # two new sequences, one free row
    assert p.q.sk.shape[1] == 4, "a stale open block was closed instead of growing"
    assert int(p.q.row[2]) == -1 and int(p.q.row[0]) >= 0, "the least recently written block closed first"
    for t in tables:  # every sequence still reads back within the int8 bound, whichever path it took
        kr, vr, kq, vq = p.gather(t, 1)
        assert rel(kq, kr) < 0.01 and rel(vq, vr) < 0.01
    p.write(seq_slots(tables[1], 1, 3))  # resume sequence 1 mid-block (reopened from codes if closed)
    kr, vr, kq, vq = p.gather(tables[1], 4)
    assert rel(kq, kr) < 0.02 and rel(vq, vr) < 0.02


def test_rollback_into_a_closed_block_and_copy_block():
    p, table = Pair("int4"), [3, 4]
    p.write(seq_slots(table, 0, 6))  # speculative tokens up to position 5
    p.write(seq_slots(table, 2, 3))  # rolled back to 2: rewrite 2..4 (block 3 closed, reopened)
    kr, vr, kq, vq = p.gather(table, 5)
    assert rel(kq, kr) < 0.15 and rel(vq, vr) < 0.15
    assert torch.equal(kq[2:4], kr[2:4]), "rewritten tokens of the reopened block are float"
    p.q.copy_block(3, 7)
    p.q.copy_block(4, 8)
    for layer in range(L):
        a, b = p.q.gather(layer, torch.tensor([[3, 4]])), p.q.gather(layer, torch.tensor([[7, 8]]))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_write_order_and_bad_formats_raise():
    q = QuantizedKVCache(L, NB, BS, H, D)
    with pytest.raises(LonghaulError, match="layer 0 first"):
        q.write(1, torch.tensor([0]), torch.zeros(1, H, D), torch.zeros(1, H, D))
    with pytest.raises(LonghaulError, match="residual=0"):
        QuantizedKVCache(L, NB, BS, H, D, fmt=KVQuant(4, residual=8))
    with pytest.raises(LonghaulError, match="unknown KV cache dtype"):
        make_kv_cache("fp8", L, NB, BS, H, D)


def test_bytes_per_token():
    # SmolLM2-135M: 30 layers, 3 KV heads of 64; bf16 float cache 23040 bytes a token
    assert kv_bytes_per_token("auto", 30, 3, 64, torch.bfloat16) == 23040
    assert kv_bytes_per_token("int8", 30, 3, 64) == 30 * 3 * (128 + 8 + 8)
    assert kv_bytes_per_token("int4", 30, 3, 64, block_size=16) == 30 * 3 * (64 + 32 + 16)
    big = QuantizedKVCache(4, 256, 16, 3, 64, fmt="int4")
    assert big.nbytes() < 0.6 * KVCache(4, 256, 16, 3, 64, torch.bfloat16).nbytes()


# ---- the model runner on a quantized cache ----------------------------------------------------


def _greedy(model, kv_cache_dtype: str, int8_weights: bool = False, forced=None, steps: int = 40):
    cfg = model.config
    kv = make_kv_cache(kv_cache_dtype, cfg.num_hidden_layers, 64, 16, cfg.num_key_value_heads,
                       cfg.hidden_size // cfg.num_attention_heads)
    runner = ModelRunner(model, kv)
    if int8_weights:  # what `quantization="int8"` does in the engine: int8 callables in place of packed weights
        for layer in runner.layers:
            layer.qkv, layer.qkv_b = quantize_linear(layer.qkv, layer.qkv_b)
            layer.o, layer.o_b = quantize_linear(layer.o, layer.o_b)
            layer.gate_up, layer.gate_up_b = quantize_linear(layer.gate_up, layer.gate_up_b)
            layer.down, layer.down_b = quantize_linear(layer.down, layer.down_b)
        runner.pack_weights()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (21, 7, 40)]
    tables = [list(range(i * 20, i * 20 + 20)) for i in range(3)]
    logits = [runner.forward(runner.prepare([BatchItem(p, 0, t) for p, t in zip(prompts, tables)]))]
    tokens, lens = [logits[0].argmax(-1).tolist()], [len(p) for p in prompts]
    for s in range(steps):
        nxt = forced[s] if forced else tokens[-1]
        items = [BatchItem([nxt[i]], lens[i], tables[i]) for i in range(3)]
        lens = [n + 1 for n in lens]
        logits.append(runner.forward(runner.prepare(items)))
        tokens.append(logits[-1].argmax(-1).tolist())
    return torch.stack(logits), tokens


@pytest.mark.parametrize("kv_dtype,int8_weights,tol", [("int8", False, 0.01), ("int4", False, 0.05), ("int8", True, 0.02)])
def test_runner_on_quantized_cache_stays_close_to_fp32(kv_dtype, int8_weights, tol):
    model, _ = load_policy("tiny-llama")
    model.eval()
    ref, tokens = _greedy(model, "auto")
    out, got = _greedy(model, kv_dtype, int8_weights, forced=tokens)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    err = rel(out, ref)
    print(f"{kv_dtype} cache, int8 weights {int8_weights}: relative logit error {err:.5f}, max abs {(out - ref).abs().max():.5f}")
    assert err < tol, f"relative logit error {err} over {tol}"
    assert got == tokens, "greedy tokens differ from the fp32 cache's"


# ---- the engine on a quantized cache ----------------------------------------------------------


def _engine_outputs(model, kv_cache_dtype: str):
    from longhaul.inference.config import EngineConfig
    from longhaul.inference.engine import LLMEngine
    from longhaul.inference.sampling import SamplingParams

    if "kv_cache_dtype" in EngineConfig.model_fields:
        engine = LLMEngine(model, num_kv_blocks=64, block_size=16, kv_cache_dtype=kv_cache_dtype)
    else:  # until the engine takes kv_cache_dtype: the same cache swapped in after construction
        engine = LLMEngine(model, num_kv_blocks=64, block_size=16)
        if kv_cache_dtype != "auto":
            kv = engine.kv
            engine.kv = engine.runner.kv = make_kv_cache(kv_cache_dtype, kv.num_layers, kv.num_blocks, kv.block_size,
                                                         kv.num_kv_heads, kv.head_dim, kv.dtype)
    assert isinstance(engine.kv, QuantizedKVCache) == (kv_cache_dtype != "auto")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (21, 7, 40)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=5, logprobs_mode="raw")
    return engine.generate(prompts, params)


@pytest.mark.parametrize("kv_dtype,tol", [("int8", 0.002), ("int4", 0.03)])
def test_engine_greedy_on_quantized_cache(kv_dtype, tol):
    """Greedy tiny-llama, 3 prompts x 40 tokens: the same tokens as the fp32 cache, and the raw
    logprobs of the top-5 tokens both return within `tol` nats (fp32 top-1/top-2 margins here
    are >= 0.23 nats)."""
    model, _ = load_policy("tiny-llama")
    model.eval()
    ref, out = _engine_outputs(model, "auto"), _engine_outputs(model, kv_dtype)
    worst = 0.0
    for a, b in zip(ref, out):
        assert len(b.token_ids) == 40 and b.token_ids == a.token_ids
        for ta, tb in zip(a.top_logprobs, b.top_logprobs):
            common = set(ta) & set(tb)  # near-ties may swap the 5th place
            assert len(common) >= 4, (ta, tb)
            worst = max(worst, max(abs(ta[t] - tb[t]) for t in common))
    print(f"{kv_dtype} cache: max |d logprob| over top-5 = {worst:.5f}")
    assert worst < tol, f"logprobs moved {worst} nats, over {tol}"


def test_engine_prefix_hits_and_bf16_on_quantized_cache():
    """A repeated prompt is served from cached (quantized) blocks and decodes as before; a bf16
    engine keeps its window in bf16."""
    from longhaul.inference.engine import LLMEngine
    from longhaul.inference.sampling import SamplingParams

    model, _ = load_policy("tiny-llama")
    model.eval()
    engine = LLMEngine(model, dtype="bfloat16", num_kv_blocks=64, block_size=16)
    kv = engine.kv
    engine.kv = engine.runner.kv = make_kv_cache("int4", kv.num_layers, kv.num_blocks, kv.block_size,
                                                 kv.num_kv_heads, kv.head_dim, kv.dtype)
    prompt = torch.randint(3, 250, (50,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    first = engine.generate([prompt], params)[0]
    again = engine.generate([prompt], params)[0]
    assert again.metrics.num_cached_tokens >= 48, "the repeated prompt should hit the prefix cache"
    assert engine.kv.sk.dtype == torch.bfloat16
    assert again.token_ids == first.token_ids
