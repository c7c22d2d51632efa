"""Quality and speed cost of longhaul's quantization on SmolLM2-135M-Instruct, one run.

Quality: perplexity on a fixed held-out text (the README and a few longhaul modules, first
`--tokens` tokens, non-overlapping windows of `--window` tokens each read from scratch) for
fp32, bf16, int8 weights and int8/int4 KV formats, with the mean KL(fp32 || mode) per token and
how often the top-1 token matches fp32. KV quantization is simulated in the HF model, not run
through the engine: an attention function registered with transformers quantizes the post-RoPE
keys and values and dequantizes them before attention, so every query sees the cache a
quantized engine would hold at that length. Keys in the newest `residual` tokens and in an
unfinished group stay float (`quant.quantized_prefix`): query t reads quantized K/V for the
tokens the policy would have quantized at length t + 1 and float for the rest.

Speed: the engine's linear shapes (fused qkv, o, fused gate_up, down, lm_head) at 1, 8 and 32
rows, fp32 / bf16 `F.linear`, the engine's prepacked bf16 linear and `Int8Linear`, per shape
and summed over one decode step of the whole model (10th percentile of single calls, the
variants interleaved, one thread by default: steadiest on a shared machine).

    python benchmarks/quant_quality.py [--tokens 2048] [--window 512] [--block 16] [--skip-speed]
    python benchmarks/quant_quality.py --skip-quality   # speed again, quality kept from --out
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import track
from rich.table import Table
from transformers import AttentionInterface

from longhaul.inference.quant import Int8Linear, KVQuant, quantize_weights, quantized_prefix
from longhaul.models import load_policy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TEXT_FILES = ["README.md", "src/longhaul/errors.py", "src/longhaul/config.py", "src/longhaul/inference/hf_sampler.py",
              "src/longhaul/rl/grpo.py", "src/longhaul/agent/single_turn.py"]
console = Console(stderr=True)


# ---- quality ---------------------------------------------------------------------------------


def held_out_ids(tok, n: int) -> torch.Tensor:
    text = "\n\n".join((ROOT / f).read_text() for f in TEXT_FILES if (ROOT / f).is_file())
    ids = tok(text, add_special_tokens=False)["input_ids"][:n]
    if len(ids) < n:
        raise SystemExit(f"held-out text has only {len(ids)} tokens; pass --tokens {len(ids)} or fewer")
    return torch.tensor(ids)


def kv_attention(spec: KVQuant, flush_group: int, window: bool):
    """An HF attention function over K/V passed through `spec` (unpadded batches, causal).

    query (B, H, T, D); key, value (B, Hkv, T, D) post-RoPE -> ((B, T, H, D), None).
    Query t sees quantized K/V for the first `quantized_prefix(t, residual, flush_group)` tokens
    (`window`: what `QuantizedKVCache` holds while decoding token t; its open block and token t
    itself are float) or of `t + 1` (no window: token t too is read back from codes).
    """

    def attend(module, query, key, value, attention_mask, scaling, dropout=0.0, **_):
        t = key.shape[-2]
        qlen = t // flush_group * flush_group  # tokens inside whole groups can be quantized
        k_group = flush_group if spec.k_axis == "channel" else None  # per-channel K: one group a block
        kq, vq = spec.fake(key[..., :qlen, :], value[..., :qlen, :], k_group=k_group)
        kq, vq = torch.cat((kq, key[..., qlen:, :]), -2), torch.cat((vq, value[..., qlen:, :]), -2)
        g = query.shape[1] // key.shape[1]
        rep = lambda x: x.repeat_interleave(g, dim=1)  # noqa: E731  (B, H, T, D)
        pos = torch.arange(t, device=query.device)
        causal = pos[None, :] <= pos[:, None]  # (T, S)
        quant = pos[None, :] < quantized_prefix(pos + (0 if window else 1), spec.residual, flush_group)[:, None]  # (T, S)
        if bool((quant == causal).all()):  # every visible token quantized: one plain attention
            out = F.scaled_dot_product_attention(query, rep(kq), rep(vq), attn_mask=causal, scale=scaling)
        else:
            s = torch.where(quant, query @ rep(kq).transpose(-1, -2), query @ rep(key).transpose(-1, -2)) * scaling
            p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
            out = (p * quant) @ rep(vq) + (p * ~quant) @ rep(value)
        return out.transpose(1, 2).contiguous(), None

    return attend


def build_modes(model, block: int) -> dict[str, tuple]:
    """name -> (model, attention implementation, what it measures)."""
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    w8 = quantize_weights(copy.deepcopy(model))
    w8_bf16 = copy.deepcopy(w8).to(torch.bfloat16)  # scales rounded to bf16, as the bf16 kernel takes them
    # (format, flush group, open-block window); "engine" rows are what QuantizedKVCache holds
    kv = {
        "kv int8 per-token, no window": (KVQuant(8), 1, False),
        f"kv int8 per-token (engine int8, block {block})": (KVQuant(8), block, True),
        "kv int4 per-token/64 ch, no window": (KVQuant(4), 1, False),
        f"kv int4 per-token/32 ch, block {block}": (KVQuant(4, k_group=32, v_group=32), block, True),
        f"kv int4 per-token/32 ch symmetric, block {block}": (KVQuant(4, k_group=32, v_group=32, symmetric=True), block, True),
        f"kv int4 K per-channel, V per-token/32 (engine int4, block {block})": (KVQuant(4, "channel", v_group=32), block, True),
        "kv int4 engine format + newest 128 float": (KVQuant(4, "channel", v_group=32, residual=128), block, True),
    }
    modes = {"fp32": (model, "sdpa"), "bf16": (bf16, "sdpa"), "int8 weights (fp32 act)": (w8, "sdpa"),
             "int8 weights + bf16 act": (w8_bf16, "sdpa")}
    for name, (spec, group, window) in kv.items():
        impl = "longhaul_kv_" + hashlib.sha1(name.encode()).hexdigest()[:8]
        AttentionInterface.register(impl, kv_attention(spec, group, window))
        modes[name] = (model, impl)
    return modes


@torch.no_grad()
def quality(model, ids: torch.Tensor, window: int, block: int) -> dict[str, dict]:
    modes = build_modes(model, block)
    sums = {m: {"nll": 0.0, "kl": 0.0, "top1": 0, "n": 0, "seconds": 0.0} for m in modes}
    chunks = [ids[i:i + window] for i in range(0, len(ids) - window + 1, window)]
    steps = [(c, m) for c in chunks for m in modes]  # fp32 first in each window: the reference
    ref = None
    for chunk, name in track(steps, description="perplexity", console=console):
        mdl, impl = modes[name]
        mdl.set_attn_implementation(impl)
        t0 = time.perf_counter()
        logits = mdl(chunk[None]).logits[0, :-1].float()  # (W-1, V)
        sums[name]["seconds"] += time.perf_counter() - t0
        mdl.set_attn_implementation("sdpa")
        logp = torch.log_softmax(logits, -1)
        if name == "fp32":
            ref = logp
        s = sums[name]
        s["nll"] -= logp.gather(1, chunk[1:, None]).sum().item()
        s["kl"] += (ref.exp() * (ref - logp)).sum().item()
        s["top1"] += (ref.argmax(-1) == logp.argmax(-1)).sum().item()
        s["n"] += len(chunk) - 1
    base = math.exp(sums["fp32"]["nll"] / sums["fp32"]["n"])
    out = {}
    for name, s in sums.items():
        ppl = math.exp(s["nll"] / s["n"])
        out[name] = {"ppl": ppl, "ppl_change_pct": 100 * (ppl / base - 1), "kl_vs_fp32": s["kl"] / s["n"],
                     "top1_agree_pct": 100 * s["top1"] / s["n"], "tokens": s["n"], "seconds": s["seconds"]}
    return out


# ---- speed -----------------------------------------------------------------------------------


def _p10_us(fns: dict, calls: int) -> dict[str, float]:
    """10th percentile of single-call times, the variants interleaved call by call: on a shared
    machine a call either runs clean or waits out a scheduler slice, and the low percentile is
    the clean cost."""
    for f in fns.values():
        f(), f(), f()
    times = {k: [] for k in fns}
    for _ in range(calls):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: sorted(v)[len(v) // 10] * 1e6 for k, v in times.items()}


def pack_bf16(w: torch.Tensor):
    """The engine's prepacked oneDNN bf16 linear (`ops.linear`), when it exists."""
    try:
        from longhaul.ops.linear import pack
    except ImportError:
        return None
    packed, _ = pack(w)
    return None if packed is w else packed


def _variants(w: torch.Tensor) -> dict[str, tuple[object, torch.dtype]]:
    """name -> (weight or callable, input dtype); each variant holds its own copy of w (out, in)."""
    out = {"fp32 F.linear": (w.float().clone(), torch.float32), "bf16 F.linear": (w.bfloat16(), torch.bfloat16)}
    packed = pack_bf16(w.bfloat16())
    if packed is not None:
        out["bf16 prepacked (engine)"] = (packed, torch.bfloat16)
    out["Int8Linear bf16"] = (Int8Linear.from_float(w).to(torch.bfloat16), torch.bfloat16)  # bf16 scales
    out["Int8Linear fp32"] = (Int8Linear.from_float(w), torch.float32)
    return out


def _apply(w, x: torch.Tensor) -> torch.Tensor:
    return w(x) if callable(w) else F.linear(x, w)


def speed(model, threads: int) -> dict:
    """Per shape (warm cache: each variant's weight is small enough to stay cached between its
    calls) and per decode step of the whole model (SmolLM2's real weights, 30 layers + lm_head,
    streamed from memory every step as in decoding; int8 runs keep lm_head float)."""
    cfg, sd = model.config, model.state_dict()
    torch.set_num_threads(threads)
    rows, gen = (1, 8, 32), torch.Generator().manual_seed(0)
    layer = lambda i, *names: torch.cat([sd[f"model.layers.{i}.{n}.weight"] for n in names])  # noqa: E731
    fused = lambda i: {"qkv": layer(i, "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),  # noqa: E731
                       "o": layer(i, "self_attn.o_proj"), "gate_up": layer(i, "mlp.gate_proj", "mlp.up_proj"),
                       "down": layer(i, "mlp.down_proj")}
    shapes = {**fused(0), "lm_head": sd["lm_head.weight"] if "lm_head.weight" in sd else sd["model.embed_tokens.weight"]}
    per_shape = {}
    for name, w in track(list(shapes.items()), description="int8 matmul, per shape", console=console):
        var = _variants(w)
        codes = var["Int8Linear bf16"][0].codes.clone()
        for m in rows:
            x = torch.randn(m, w.shape[1], generator=gen)
            xs = {torch.float32: x, torch.bfloat16: x.bfloat16()}
            fns = {k: (lambda wt=wt, dt=dt: _apply(wt, xs[dt])) for k, (wt, dt) in var.items()}
            scale_b = var["Int8Linear bf16"][0].scale
            fns["int8pack kernel, bf16 x"] = lambda: torch._weight_int8pack_mm(xs[torch.bfloat16], codes, scale_b)
            if name != "lm_head":  # the fp32 kernel takes seconds there
                scale_f = var["Int8Linear fp32"][0].scale
                fns["int8pack kernel, fp32 x"] = lambda: torch._weight_int8pack_mm(x, codes, scale_f)
            per_shape[f"{name} {tuple(w.shape)} rows={m}"] = _p10_us(fns, calls=20 if name == "lm_head" else 100)
    stacks: dict[str, list] = {}
    for i in range(cfg.num_hidden_layers):
        for name, w in fused(i).items():
            for k, (wt, dt) in _variants(w).items():
                stacks.setdefault(k, []).append((wt, dt))
    lm = _variants(shapes["lm_head"])
    for k in stacks:  # int8 runs keep lm_head in float, as quantize_weights does by default (tied to the embedding)
        stacks[k].append(lm.get({"Int8Linear bf16": "bf16 prepacked (engine)", "Int8Linear fp32": "fp32 F.linear"}.get(k, k))
                         or lm["bf16 F.linear"])
    step = {}
    for m in track(rows, description="int8 matmul, decode step", console=console):
        xs = {(dt, d): torch.randn(m, d, generator=gen).to(dt) for dt in (torch.float32, torch.bfloat16)
              for d in (cfg.hidden_size, cfg.intermediate_size)}
        fns = {k: (lambda st=st: [_apply(wt, xs[dt, wt.shape[1] if isinstance(wt, torch.Tensor) else wt.in_features])
                                  for wt, dt in st]) for k, st in stacks.items()}
        step[f"rows={m}"] = _p10_us(fns, calls=10)
    bytes_ = {k: sum(_nbytes(wt) for wt, _ in st) for k, st in stacks.items()}
    return {"per_shape_us": per_shape, "decode_step_linears_us": step, "weight_bytes": bytes_, "threads": threads}


def _nbytes(w) -> int:
    if isinstance(w, torch.Tensor):
        return w.numel() * w.element_size()
    if isinstance(w, Int8Linear):
        return sum(b.numel() * b.element_size() for b in w.buffers())
    return w.out_features * w.in_features * 2  # prepacked bf16


# ---- report ----------------------------------------------------------------------------------


def show(results: dict) -> None:
    out = Console(width=160)
    t = Table(title=f"SmolLM2-135M-Instruct perplexity, {results['tokens']} tokens in windows of {results['window']}")
    for c in ("mode", "ppl", "Δppl %", "KL vs fp32", "top-1 = fp32 %", "s"):
        t.add_column(c, justify="left" if c == "mode" else "right")
    for name, r in results["quality"].items():
        t.add_row(name, f"{r['ppl']:.3f}", f"{r['ppl_change_pct']:+.2f}", f"{r['kl_vs_fp32']:.5f}",
                  f"{r['top1_agree_pct']:.1f}", f"{r['seconds']:.1f}")
    out.print(t)
    if "speed" in results:
        sp = results["speed"]
        t = Table(title=f"linear time, µs (10th percentile of single calls, {sp['threads']} thread(s))")
        cols = list(next(iter(sp["per_shape_us"].values())))
        t.add_column("shape")
        for c in cols:
            t.add_column(c, justify="right")
        for shape, r in list(sp["per_shape_us"].items()) + [(f"decode step {k}", v) for k, v in sp["decode_step_linears_us"].items()]:
            t.add_row(shape, *(f"{r[c]:.0f}" if c in r else "" for c in cols))
        out.print(t)
        out.print("linear weights of the decode step, MB: " + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in sp["weight_bytes"].items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--block", type=int, default=16, help="KV block size: the per-channel key group and flush unit")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-quality", action="store_true", help="keep the quality results already in --out")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the speed part (1: steadiest on a shared machine)")
    ap.add_argument("--out", default=str(HERE / "results" / "quant_quality.json"))
    args = ap.parse_args()
    model, tok = load_policy("smollm2-135m-instruct")
    model.eval()
    out = Path(args.out)
    ids = held_out_ids(tok, args.tokens)
    results = {"model": "smollm2-135m-instruct", "tokens": args.tokens, "window": args.window, "block": args.block,
               "text_files": TEXT_FILES, "text_sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest(),
               "torch": torch.__version__}
    if args.skip_quality:
        old = json.loads(out.read_text()) if out.is_file() else {}
        if "quality" not in old:
            raise SystemExit(f"--skip-quality needs earlier quality results in {out}; run once without it")
        results.update({k: v for k, v in old.items() if k != "speed"})
    else:
        results["quality"] = quality(model, ids, args.window, args.block)
    if not args.skip_speed:
        results["speed"] = speed(model, args.threads)
    show(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2))
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
