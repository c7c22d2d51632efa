"""Decode and prefill speed of the engine against llama.cpp, side by side in one sitting.

    python benchmarks/decode.py --llamacpp PATH/llamacpp_bench.sh [--dtypes bfloat16,float32,int8]
                                [--batch-sizes 1,8,32] [--repeats 3] [--out benchmarks/results/decode.json]

Ours: `LLMEngine` on SmolLM2-135M-Instruct with `bench engine`'s prompts and counting (the first B
Fibonacci prompts through the chat template, about 44 tokens each, exactly 128 new tokens each at
T=1, tokens over the wall time of the whole call, prefill included, best of `--repeats`), and
pp512: a 512-token prompt prefilled (one new token), tokens/s. llama.cpp: the anchor script given
by path (it builds llama.cpp, converts the same weights and runs llama-bench and
llama-batched-bench with the same prompt length, 128 new tokens and the same thread count),
right after ours. Matched precisions: bf16 - bf16, fp32 - F32, int8 (ours: per-channel scales) - Q8_0,
q8_0 and q4_0 (llama.cpp's formats, quantized at load) - Q8_0 and Q4_0, gguf (the shipped Q4_1 file's
blocks as stored) - Q4_1.

llama.cpp's figures: batch 1/8/32 "incl. prefill" from llama-batched-bench (B x 128 over the whole
run), pp512 and tg128 (batch 1, generation only) from llama-bench. `--llamacpp-json` takes the JSON
the anchor script wrote in the same sitting instead of running it (for a format it could not run).

Also the host's read bandwidth (the best of several sums over 1 GiB on huge pages) and, per
precision, the batch-1 limit it sets: one read of every weight a token (the linears and the LM
head), so each b1 figure is also given as a share of that limit. A shared host's bandwidth moves
within seconds, so each batch-1 run is bracketed by two reads of it and measured against the
higher: the share is the best run's, and every run's figures go to the JSON. Prints a table and
writes the JSON (temporary file, then rename).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from longhaul.errors import LonghaulError
from longhaul.hardware import resolve_dtype
from longhaul.inference.bench import _engine_generate, _timed, fib_prompts
from longhaul.inference.engine import LLMEngine
from longhaul.inference.quant import Int8Linear
from longhaul.inference.quant_blocks import BlockLinear
from longhaul.models import load_policy
from longhaul.ops.linear import pack
from longhaul.ops.pages import on_huge_pages

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "decode.json"
ANCHOR_WEIGHTS = {"bfloat16": "bf16", "float32": "f32", "int8": "q8_0",
                  # llama.cpp's block formats: quantized at load from the fp32 weights (as llama-quantize
                  # makes its Q8_0 and Q4_0 files), and `gguf`: the shipped Q4_1 file's blocks as stored
                  "q8_0": "q8_0", "q4_0": "q4_0", "gguf": "q4_1",
                  # the engine without its native bf16 / int8 decode kernels (oneDNN's packed bf16 linears;
                  # torch's int8 weight-only matmul): what those kernels change, in the same sitting
                  "bfloat16-onednn": "bf16", "int8-torch": "q8_0"}
QUANTIZED = ("int8", "int8-torch", "q8_0", "q4_0", "gguf")
MODEL = "smollm2-135m-instruct"


class ReadBandwidth:
    """Bytes/s of a sum over `gib` GiB of fp32 with torch's threads: the best of `repeats`. The
    array sits on huge pages as the engine's packed weights do (4 KiB pages read slower), and is
    allocated once for every reading."""

    def __init__(self, gib: float = 1.0):
        self.x = on_huge_pages(torch.ones(int(gib * 2**30) // 4))

    def __call__(self, repeats: int = 5) -> float:
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            self.x.sum().item()
            best = min(best, time.perf_counter() - t)
        return self.x.numel() * 4 / best


def weight_bytes(engine) -> int:
    """Bytes a decode step reads: every linear's weight in the engine's format (codes and scales
    for the quantized ones) and the LM head."""
    total = 0
    for w in [x for layer in engine.runner._exec for x in (layer[1], layer[3], layer[6], layer[8])] + [engine.runner._lm_head]:
        if isinstance(w, BlockLinear):
            total += w.weight_bytes()
        elif isinstance(w, Int8Linear):
            total += w.codes.numel() + 4 * w.out_features
        else:
            n, k = (w.out_features, w.in_features) if hasattr(w, "out_features") else w.shape
            total += n * k * engine.config.torch_dtype.itemsize
    return total


def ours(dtype: str, sizes: list[int], repeats: int, log, probe: ReadBandwidth) -> dict:
    hf, tok = load_policy(MODEL)
    quant = dtype.split("-")[0] if dtype in QUANTIZED else None
    source = MODEL if quant == "gguf" else hf  # the file's blocks: the engine reads them by the model's name
    engine = LLMEngine(source, dtype=resolve_dtype("auto") if quant else dtype.split("-")[0], tokenizer=tok, quantization=quant)
    if dtype == "bfloat16-onednn":
        engine.runner.pack_weights(lambda w, b: pack(w, b, few_rows=False))
        engine.runner._lm_head = pack(engine.runner.lm_head, few_rows=False)[0]
    elif dtype == "int8-torch":
        engine.runner.pack_weights(lambda w, b: (None, b) if w is None else (Int8Linear.from_float(w, b), None))
    prompts = fib_prompts(tok, max(64, max(sizes)))
    _engine_generate(engine, prompts[:2], 8, 0)  # warm-up
    out = {"engine_dtype": engine.config.dtype, "decode": {}, "weight_bytes": weight_bytes(engine)}
    for b in sizes:
        if b == 1:  # each run between two readings of the bandwidth
            runs = []
            for _ in range(repeats):
                engine.flush_prefix_cache()
                before = probe(3)
                t = time.perf_counter()
                n = _engine_generate(engine, prompts[:1], 128, 1)
                t = time.perf_counter() - t
                after = probe(3)
                limit = max(before, after) / out["weight_bytes"]
                runs.append({"tok_s": round(n / t, 1), "read_gbs": [round(before / 1e9, 1), round(after / 1e9, 1)],
                             "limit_tok_s": round(limit, 1), "share": round(n / t / limit, 3)})
            out["b1_runs"] = runs
            out["decode"][b] = max(r["tok_s"] for r in runs)
            best = max(runs, key=lambda r: r["share"])
            log(f"ours {dtype} b1: {out['decode'][b]:.1f} tok/s, best share {100 * best['share']:.0f}% of {best['limit_tok_s']:.0f}")
            continue
        n, t = _timed(lambda: _engine_generate(engine, prompts[:b], 128, 1), repeats, engine.flush_prefix_cache)
        out["decode"][b] = round(n / t, 1)
        log(f"ours {dtype} b{b}: {n / t:.1f} tok/s")
    long = (sum(prompts, []) * 20)[:512]
    _, t = _timed(lambda: _engine_generate(engine, [long], 1, 0), repeats, engine.flush_prefix_cache)
    out["pp512"] = round(512 / t, 1)
    log(f"ours {dtype} pp512: {512 / t:.1f} tok/s")
    return out


def b1_share(runs: list[dict]) -> dict:
    """The batch-1 row's share of the limit: the best run's, with every run's figures."""
    best = max(runs, key=lambda r: r["share"])
    return {"share_of_b1_limit": best["share"], "b1_limit_tok_s": best["limit_tok_s"], "b1_runs": runs}


def llamacpp(script: Path, threads: int, log) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "llamacpp.json"
        log(f"llama.cpp: {script} (builds once; then measures every format)")
        r = subprocess.run(["bash", str(script), str(path)], env={**os.environ, "THREADS": str(threads)},
                           capture_output=True, text=True)
        if r.returncode != 0 or not path.exists():
            raise LonghaulError(f"the llama.cpp anchor failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-300:]}")
        log(r.stdout.strip())
        return json.loads(path.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llamacpp", help="the llama.cpp anchor script (llamacpp_bench.sh), run after ours")
    ap.add_argument("--llamacpp-json", help="instead, the JSON that script wrote in this sitting (a format whose run failed "
                                            "there is left out of it; its rows show '-')")
    ap.add_argument("--dtypes", default="bfloat16,float32,int8,q8_0,q4_0,gguf,bfloat16-onednn,int8-torch")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--debug", action="store_true")
    a = ap.parse_args()
    log = lambda m: print(f"decode: {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        if bool(a.llamacpp) == bool(a.llamacpp_json):
            raise LonghaulError("pass one of --llamacpp (the anchor script) or --llamacpp-json (its output from this sitting)")
        given = Path(a.llamacpp or a.llamacpp_json)
        if not given.is_file():
            raise LonghaulError(f"{given} is not a file; pass the anchor script's path (or the JSON it wrote)")
        dtypes = [d.strip() for d in a.dtypes.split(",")]
        if bad := [d for d in dtypes if d not in ANCHOR_WEIGHTS]:
            raise LonghaulError(f"--dtypes: unknown {bad[0]!r}; use {', '.join(ANCHOR_WEIGHTS)}")
        try:
            sizes = [int(x) for x in a.batch_sizes.split(",")]
        except ValueError:
            raise LonghaulError(f"--batch-sizes must be comma-separated integers, got {a.batch_sizes!r}") from None
        threads = torch.get_num_threads()
        probe = ReadBandwidth()
        bw = probe()
        log(f"read bandwidth {bw / 1e9:.1f} GB/s ({threads} threads)")
        mine = {d: ours(d, sizes, a.repeats, log, probe) for d in dtypes}
        anchor = llamacpp(given, threads, log) if a.llamacpp else json.loads(given.read_text())
    except LonghaulError as e:
        if a.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = []
    for d in dtypes:
        theirs = anchor["weights"].get(ANCHOR_WEIGHTS[d], {})
        for b in sizes:
            lc = theirs.get("incl_prefill", {}).get(str(b))
            tg = theirs.get("tg128_b1") if b == 1 else None
            got = mine[d]["decode"][b]
            rows.append({"dtype": d, "llamacpp_weights": ANCHOR_WEIGHTS[d], "batch_size": b, "ours_tok_s": got,
                         "llamacpp_tok_s": round(lc, 1) if lc else None, "ratio": round(got / lc, 2) if lc else None,
                         **({"llamacpp_tg128_b1": round(tg, 1)} if tg else {}),
                         **(b1_share(mine[d]["b1_runs"]) if b == 1 else {})})
        lp = theirs.get("pp512")
        rows.append({"dtype": d, "llamacpp_weights": ANCHOR_WEIGHTS[d], "batch_size": "pp512", "ours_tok_s": mine[d]["pp512"],
                     "llamacpp_tok_s": round(lp, 1) if lp else None, "ratio": round(mine[d]["pp512"] / lp, 2) if lp else None})
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.machine())
    result = {"model": MODEL, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": {"cpu": cpu, "threads": threads,
              "read_bandwidth_gbs": round(bw / 1e9, 1), "torch": torch.__version__}, "llamacpp": {k: anchor.get(k) for k in ("commit", "threads", "reps")},
              "new_tokens": 128, "rows": rows}
    print(f"{'precision':22s} {'batch':>6s} {'ours':>8s} {'llama.cpp':>10s} {'ratio':>6s}  b1 share of the weight-streaming limit")
    for r in rows:
        share = f"{100 * r['share_of_b1_limit']:.0f}% of {r['b1_limit_tok_s']:.0f}" if "share_of_b1_limit" in r else ""
        lc = f"{r['llamacpp_tok_s']:.1f}" if r["llamacpp_tok_s"] else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        print(f"{r['dtype'] + '/' + r['llamacpp_weights']:22s} {str(r['batch_size']):>6s} {r['ours_tok_s']:8.1f} {lc:>10s} {ratio:>6s}  {share}")
    out = Path(a.out)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
