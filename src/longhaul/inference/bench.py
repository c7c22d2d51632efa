"""`longhaul bench engine`: decode throughput of `LLMEngine` beside HF `generate`, one process.

Owns the benchmark protocol and its result file. Both generators get the same prompts (the
i-th is "Write a Python function that returns the {i}th Fibonacci number." through the
chat template), the same dtype, pure sampling at T=1 and exactly `max_tokens` new tokens
(the engine with `ignore_eos`, HF with `min_new_tokens`); each batch size takes the first B
prompts. One short warm-up run of each precedes the timings; each timing is the best of
`repeats` runs (the machine is shared: the best run is the least disturbed one), the engine's
prefix cache flushed before each. Throughput is generated tokens over the wall time of the
whole `generate` call, prefill included, as vLLM's offline benchmark counts it.

Given an anchor environment (a venv with vLLM's CPU build) and the anchor's benchmark script
(`--anchors`, `--anchor-script`), `vllm_anchor` runs that script in a subprocess right after our
rows, on the same model, dtype and batch sizes, so the rows carry a side-by-side `vllm_tok_s`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch

from longhaul.inference.engine import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.malloc import foreign_env
from longhaul.models import load_policy

RESULTS = Path("benchmarks/results/engine.json")


def fib_prompts(tok, n: int = 64) -> list[list[int]]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Write a Python function that returns the {i}th Fibonacci number."}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append(tok.encode(text, add_special_tokens=False))
    return out


@torch.inference_mode()
def _hf_generate(model, tok, prompts: list[list[int]], max_tokens: int, seed: int) -> int:
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=pad)
    return (out.shape[1] - width) * len(prompts)


def _engine_generate(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, seed: int) -> int:
    params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=seed + i) for i in range(len(prompts))]
    return sum(len(o.token_ids) for o in engine.generate(prompts, params))


def _timed(fn: Callable[[], int], repeats: int, before: Callable[[], None] = lambda: None) -> tuple[int, float]:
    """(tokens, best wall seconds) over `repeats` runs."""
    best = (0, float("inf"))
    for _ in range(repeats):
        before()
        t = time.perf_counter()
        n = fn()
        best = min(best, (n, time.perf_counter() - t), key=lambda r: r[1])
    return best


def bench_engine(model: str = "smollm2-135m-instruct", batch_sizes: tuple[int, ...] = (1, 8, 32), max_tokens: int = 128,
                 dtype: str = "bfloat16", repeats: int = 2, log: Callable[[str], None] = lambda s: None, device: str = "auto") -> dict:
    """Tokens/s of the engine and of HF generate at each batch size, both on `device`; returns the result dict."""
    hf, tok = load_policy(model)
    hf.eval()
    prompts = fib_prompts(tok, max(64, max(batch_sizes)))
    engine = LLMEngine(hf, dtype=dtype, tokenizer=tok, device=device)  # copies the weights out before the cast below
    hf = hf.to(engine.config.torch_dtype).to(engine.config.device)
    log(f"warm-up ({model}, {dtype}, {engine.config.device}, {torch.get_num_threads()} threads)")
    _engine_generate(engine, prompts[:2], 8, 0)
    _hf_generate(hf, tok, prompts[:2], 8, 0)
    rows = []
    for b in batch_sizes:
        log(f"batch {b}: engine")
        n_ours, t_ours = _timed(lambda: _engine_generate(engine, prompts[:b], max_tokens, 1), repeats, engine.flush_prefix_cache)
        log(f"batch {b}: engine {n_ours / t_ours:.1f} tok/s; HF generate")
        n_hf, t_hf = _timed(lambda: _hf_generate(hf, tok, prompts[:b], max_tokens, 1), repeats)
        log(f"batch {b}: HF generate {n_hf / t_hf:.1f} tok/s")
        rows.append({"dtype": dtype, "batch_size": b, "engine_tok_s": round(n_ours / t_ours, 2), "hf_tok_s": round(n_hf / t_hf, 2),
                     "ratio": round((n_ours / t_ours) / (n_hf / t_hf), 2), "engine_s": round(t_ours, 3), "hf_s": round(t_hf, 3),
                     "engine_tokens": n_ours, "hf_tokens": n_hf})
    config = engine.config.model_dump(exclude={"model", "dtype"})
    return {"model": model, "max_tokens": max_tokens, "temperature": 1.0, "prompts": "fibonacci x64, chat template", "repeats": repeats,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "processor": platform.processor() or platform.machine(), "device": engine.config.device,
                        **({"gpu": torch.cuda.get_device_name()} if engine.config.device.startswith("cuda") else {})},
            "engine_config": config, "rows": rows}


def vllm_anchor(dtype: str, anchors: Path, script: Path | None, log: Callable[[str], None] = lambda s: None) -> dict[int, float] | None:
    """{batch size: tokens/s} of vLLM-CPU from the anchor script, or None when the anchor
    environment or script is missing (the table then says so)."""
    py, model_dir = anchors / "vllm" / "bin" / "python", anchors / "smollm2-135m-instruct"
    if script is None:
        log("no vLLM anchor: pass --anchor-script (and --anchors) to compare side by side")
        return None
    if not (py.exists() and script.is_file() and (model_dir / "config.json").is_file()):
        log(f"no vLLM anchor ({py}, {model_dir} or {script} missing); pass --anchors and --anchor-script to compare side by side")
        return None
    log(f"vLLM-CPU anchor ({dtype})")
    env = {**foreign_env(), "VLLM_CPU_KVCACHE_SPACE": "2"}  # the anchor with its own allocator, not longhaul's
    out = subprocess.run([str(py), str(script), str(model_dir), dtype], capture_output=True, text=True, env=env, timeout=1800)
    found = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"bs=(\d+) .*?tok/s=([\d.]+)", out.stdout)}
    if not found:
        log(f"vLLM anchor printed no throughput: {(out.stderr or out.stdout)[-500:]}")
        return None
    return found


def add_anchor(result: dict, anchor: dict[int, float] | None) -> dict:
    for r in result["rows"]:
        v = (anchor or {}).get(r["batch_size"])
        r["vllm_tok_s"] = v
        r["ratio_vs_vllm"] = round(r["engine_tok_s"] / v, 2) if v else None
    return result


def save_result(result: dict, path: Path = RESULTS) -> Path:
    """Merge the result's rows into the file, atomically. Each row carries its run's settings;
    a new row replaces the one of the same model, max_tokens, dtype and batch size."""
    old = json.loads(path.read_text()) if path.exists() else {}
    run = {k: v for k, v in result.items() if k != "rows"}
    key = lambda r: (r["model"], r["max_tokens"], r["dtype"], r["batch_size"])  # noqa: E731
    new_rows = [{**run, **r} for r in result["rows"]]
    fresh = {key(r) for r in new_rows}
    rows = [r for r in old.get("rows", []) if key(r) not in fresh] + new_rows
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"rows": sorted(rows, key=key)}, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def format_table(result: dict) -> str:
    lines = [f"{result['model']}, {result['max_tokens']} new tokens, T=1 ({result['machine']['threads']} threads)",
             f"{'dtype':9s} {'batch':>5s} {'engine tok/s':>13s} {'HF tok/s':>9s} {'vs HF':>6s} {'vLLM-CPU':>9s} {'vs vLLM':>8s}"]
    for r in result["rows"]:
        v = r.get("vllm_tok_s")
        vl = f"{v:9.1f} {r['ratio_vs_vllm']:7.2f}x" if v else f"{'-':>9s} {'-':>8s}"
        lines.append(f"{r['dtype']:9s} {r['batch_size']:5d} {r['engine_tok_s']:13.1f} {r['hf_tok_s']:9.1f} {r['ratio']:5.2f}x {vl}")
    return "\n".join(lines)
