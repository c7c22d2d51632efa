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
