"""Calls from many threads against one batched call, on longhaul's engine and on the vLLM sampler:
do the episodes of a rollout, each asking for its own turn from its own thread, share the
engine's steps?

SmolLM2-135M-Instruct in fp32, PROMPTS prompts of 48 greedy tokens each: once as one call with
every prompt, once as one call a prompt from as many threads at once; tokens/s, best of REPEATS.
Calls that share steps run near the batched rate; calls served one after another run at the
rate of batch 1.

    LONGHAUL_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/vllm_calls.py [--prompts 8] [--repeats 2]

Writes benchmarks/results/vllm_calls.json.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import host, write_json

OUT = Path(__file__).resolve().parent / "results" / "vllm_calls.json"
TEXTS = ["def add(a, b):", "The capital of France is", "Write a haiku about the sea.", "1, 1, 2, 3, 5, 8,"]


def rates(engine, prompts: list[list[int]], repeats: int) -> dict:
    from longhaul.inference import RolloutParams, generate

    params = RolloutParams(max_new_tokens=48, temperature=0.0)
    generate(engine, None, prompts[:1], params)  # warm-up
    best = {"one call": 0.0, "a call a thread": 0.0}
    for _ in range(repeats):
        t = time.perf_counter()
        n = sum(len(c.token_ids) for c in generate(engine, None, prompts, params))
        best["one call"] = max(best["one call"], n / (time.perf_counter() - t))
        t = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            outs = list(pool.map(lambda p: generate(engine, None, [p], params)[0], prompts))
        n = sum(len(c.token_ids) for c in outs)
        best["a call a thread"] = max(best["a call a thread"], n / (time.perf_counter() - t))
    return {k: round(v, 1) for k, v in best.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    from longhaul.inference import LLMEngine
    from longhaul.inference.vllm_engine import VLLMEngine
    from longhaul.models import load_policy, prepare_builtin

    path = prepare_builtin("smollm2-135m-instruct", log=print)
    model, tok = load_policy("smollm2-135m-instruct")
    prompts = [tok.encode(TEXTS[i % len(TEXTS)]) for i in range(args.prompts)]
    result = {"host": host(), "model": "smollm2-135m-instruct", "dtype": "float32", "prompts": args.prompts,
              "new_tokens": 48, "engines": {}}
    ours = LLMEngine(model, tokenizer=tok, dtype="float32", max_model_len=1024)
    result["engines"]["longhaul"] = rates(ours, prompts, args.repeats)
    del ours
    theirs = VLLMEngine(path, dtype="float32", max_model_len=1024)
    try:
        result["engines"]["vllm"] = rates(theirs, prompts, args.repeats)
        result["vllm_version"] = theirs.version
    finally:
        theirs.close()
    print(f"{'engine':10s} {'one call':>10s} {'a call a thread':>16s}  (tok/s, {args.prompts} prompts, {host()})")
    for name, r in result["engines"].items():
        print(f"{name:10s} {r['one call']:10.1f} {r['a call a thread']:16.1f}")
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
