"""What the engine's quantized weight formats cost on tasks, one run, SmolLM2-135M-Instruct.

For each format (the unquantized engine in `--dtype` first, then int8, Q8_0, Q4_0, Q4_1
quantized at load, and the GGUF file's own Q4_1 blocks as stored):
- greedy agreement with the unquantized engine: the same fixed prompts (HumanEval's first
  `--prompts` problems), `--tokens` new tokens each, greedy; the share of tokens equal to the
  reference's up to the first difference, and the share of completions equal throughout;
- HumanEval pass@1: greedy, `--humaneval-tasks` problems, 384 new tokens, the hidden tests in
  the sandbox, with a 95% Wilson interval and an exact McNemar test against the unquantized
  engine on the same problems.

    python benchmarks/quant_tasks.py [--formats none,int8,q8_0,q4_0,q4_1,gguf] [--dtype auto]
                                     [--prompts 32] [--tokens 64] [--humaneval-tasks 164]

Prints a table and writes `benchmarks/results/quant_tasks.json` (written whole at the end,
through a temporary file).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from render_results import write_atomic
from rich.console import Console
from rich.table import Table

from longhaul.envinfo import collect
from longhaul.envs import get_family
from longhaul.eval.passrate import evaluate
from longhaul.eval.stats import mcnemar_exact, wilson
from longhaul.hardware import resolve_dtype
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams

HERE = Path(__file__).resolve().parent
console = Console(stderr=True)
FORMATS = ("none", "int8", "q8_0", "q4_0", "q4_1", "gguf")


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict:
    """Share of reference tokens matched before each completion's first difference, and the
    share of completions equal throughout."""
    prefix = total = 0
    for r, g in zip(ref, got):
        n = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), min(len(r), len(g)))
        prefix += n
        total += len(r)
    return {"prefix_tokens_pct": 100.0 * prefix / max(1, total),
            "identical_pct": 100.0 * sum(r == g for r, g in zip(ref, got)) / max(1, len(ref))}


def run_format(fmt: str, dtype: str, model: str, prompts: list[list[int]], tokens: int, tasks: list, family) -> dict:
    t0 = time.perf_counter()
    engine = LLMEngine(model, dtype=dtype, quantization=None if fmt == "none" else fmt, max_model_len=2048)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    greedy_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = evaluate(engine, engine.tokenizer, family, tasks, fmt, 384, batch_size=32) if tasks else None
    he_s = time.perf_counter() - t0
    return {"format": fmt, "dtype": dtype, "build_s": built, "greedy_s": greedy_s, "humaneval_s": he_s,
            "tokens": [o.token_ids for o in outs], "passed": res.passed if res else []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated; 'none' (the unquantized reference) always runs first")
    ap.add_argument("--dtype", default="auto", help="the engine's activations and unquantized weights: float32, bfloat16 or auto")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--humaneval-tasks", type=int, default=164, help="0 skips HumanEval")
    ap.add_argument("--out", default=str(HERE / "results" / "quant_tasks.json"))
    args = ap.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise SystemExit(f"--formats: {bad[0]!r} is not one of {', '.join(FORMATS)}")
    formats = ["none", *[f for f in formats if f != "none"]]
    dtype = resolve_dtype(args.dtype)

    family = get_family("humaneval")
    tasks = family.make_split("heldout", args.humaneval_tasks, 1, None) if args.humaneval_tasks else []
    probe = LLMEngine(args.model, dtype=dtype, max_model_len=2048)
    tok = probe.tokenizer
    del probe
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t.prompt}], add_generation_prompt=True, tokenize=False),
                          add_special_tokens=False) for t in family.make_split("heldout", args.prompts, 1, None)]

    runs = []
    for fmt in formats:
        console.print(f"quant_tasks: {fmt} ({dtype})")
        runs.append(run_format(fmt, dtype, args.model, prompts, args.tokens, tasks, family))
    ref = runs[0]
    rows = []
    for r in runs:
        k, n = sum(r["passed"]), len(r["passed"])
        row = {"format": r["format"], "dtype": dtype, **agreement(ref["tokens"], r["tokens"]),
               "humaneval": {"passed": k, "n": n, "pass_rate": k / n if n else None, "ci95": list(wilson(k, n)) if n else None,
                             "vs_unquantized": mcnemar_exact(ref["passed"], r["passed"]) if n and r is not ref else None},
               "seconds": {"build": round(r["build_s"], 2), "greedy": round(r["greedy_s"], 2), "humaneval": round(r["humaneval_s"], 2)}}
        rows.append(row)

    table = Table(title=f"quantized formats on tasks, {args.model}, {dtype} activations")
    for col in ("format", "greedy tokens agreeing (prefix)", "completions identical", "HumanEval pass@1", "95% interval",
                "vs unquantized (gained / lost, p)"):
        table.add_column(col)
    for row in rows:
        he, vs = row["humaneval"], row["humaneval"]["vs_unquantized"]
        table.add_row(row["format"], f"{row['prefix_tokens_pct']:.1f}%", f"{row['identical_pct']:.1f}%",
                      f"{he['passed']}/{he['n']}" if he["n"] else "-",
                      f"[{100 * he['ci95'][0]:.1f}, {100 * he['ci95'][1]:.1f}]" if he["n"] else "-",
                      f"{vs['gained']} / {vs['lost']}, p = {vs['p_value']:.2g}" if vs else "-")
    Console(width=160).print(table)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"model": args.model, "dtype": dtype, "prompts": args.prompts, "tokens": args.tokens,
            "humaneval_tasks": args.humaneval_tasks, "host": collect()["cpu"], "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "formats": rows}
    write_atomic(out, json.dumps(data, indent=1) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
