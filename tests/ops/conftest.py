import torch

from longhaul.inference.kv_cache import KVCache
from longhaul.inference.model_runner import BatchItem, ModelRunner
from longhaul.ops.linear import pack


def cache_with(lens, hkv, d, block_size=4, seed=0, dtype=torch.float32):
    """A KV cache holding random K/V for sequences of `lens` tokens in scattered blocks, with
    their block tables (padded with block 0) and lengths."""
    gen = torch.Generator().manual_seed(seed)
    per = [-(-n // block_size) for n in lens]
    kv = KVCache(1, sum(per) + 3, block_size, hkv, d, dtype=dtype)
    kv.k.copy_(torch.randn(kv.k.shape, generator=gen))
    kv.v.copy_(torch.randn(kv.v.shape, generator=gen))
    blocks = torch.randperm(kv.num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for p in per:
        tables.append(blocks[at:at + p])
        at += p
    nb = max(per)
    return kv, torch.tensor([t + [0] * (nb - len(t)) for t in tables]), torch.tensor(lens)


def runner_pair(model, dtype):
    """Two runners of `model` in `dtype`, the first on the native kernels (where they run), the
    second on torch's ops and oneDNN's linears, and the logits each returns for one batch of
    three prompts (prefill chunks) and then three decode steps of all three sequences."""
    runners = []
    for use in (True, False):
        kv = KVCache(model.config.num_hidden_layers, 16, 4, model.config.num_key_value_heads,
                     model.config.hidden_size // model.config.num_attention_heads, dtype=dtype)
        r = ModelRunner(model, kv, dtype=dtype)
        if not use:
            r.native = None
            r.pack_weights(lambda w, b: pack(w, b, few_rows=False))
        runners.append(r)
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4, 8], [11, 2, 6, 6, 6, 1, 9, 10, 3]]
    tables = [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    outs = []
    for r in runners:
        got = [r.forward(r.prepare([BatchItem(p, 0, t) for p, t in zip(prompts, tables)]))]
        for step in range(3):
            items = [BatchItem([(7 * step + i) % 50 + 1], len(p) + step, t) for i, (p, t) in enumerate(zip(prompts, tables))]
            got.append(r.forward(r.prepare(items)))
        outs.append(torch.cat(got))
    return runners, outs


def whole_equals_general(name, dtype, quant, temps=(1.0, 0.7, 0.0), steps=4):
    """Two engines' runners of one model: one steps through `forward` and `sampling.sample`, the
    other through `decode_sample` (the whole native step), fed the same tokens with generators of
    the same seeds; every step's tokens, log-probabilities and generator states must agree. A
    generator is drawn from once a step where its temperature is positive, never where it is 0."""
    from longhaul.inference import LLMEngine, SamplingParams
    from longhaul.inference.sampling import sample
    from longhaul.models import load_policy

    prompts, tables = [[5, 9, 2, 7, 1], [4, 4, 8], [3, 6]], [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # blocks of 4
    model, _ = load_policy(name)
    general, whole = (LLMEngine(model, dtype=dtype, quantization=quant, adaptive_threads=False, num_kv_blocks=12,
                                block_size=4).runner for _ in range(2))
    assert whole._native_layers is not None and whole._native_layers[0].has_head
    for r in (general, whole):
        r.forward(r.prepare([BatchItem(p, 0, t) for p, t in zip(prompts, tables)]))
    params = [SamplingParams(temperature=t) for t in temps]
    g_general = [torch.Generator().manual_seed(7 + i) for i in range(len(temps))]
    g_whole = [torch.Generator().manual_seed(7 + i) for i in range(len(temps))]
    tokens, positions = [11, 20, 30], [len(p) for p in prompts]
    for _ in range(steps):
        before = [g.get_state() for g in g_whole]
        items = [BatchItem([t], p, b) for t, p, b in zip(tokens, positions, tables)]
        want = sample(general.forward(general.prepare(items)), params, g_general, [[]] * len(temps))
        got = whole.decode_sample(items, list(temps), g_whole)
        assert got == (want.token_ids, want.logprobs)
        for t, a, b, old in zip(temps, g_general, g_whole, before):
            assert torch.equal(a.get_state(), b.get_state())
            assert torch.equal(b.get_state(), old) == (t == 0)
        tokens, positions = want.token_ids, [p + 1 for p in positions]
