"""Peak memory and time of one long training micro-batch under each C allocator.

The micro-batch is what the main job's GRPO stage trains on: `--rows` episodes of `--tokens`
tokens each (a 300-token prompt, the rest completion), SmolLM2-135M-Instruct with LoRA r16 on
every projection, the packed forward and fused head, one forward and backward. Each allocator
runs in a process of its own (the setting is process-wide), `--iters` micro-batches after one
another, the heap bounded between them as a training loop does (`malloc.between_steps`, limit
`--free-gb`). Peak is the kernel's high-water mark of resident memory over one micro-batch
(reset before it); "live" is the same run under glibc with every buffer over 1 MB mapped and
unmapped on its own (nothing kept), for how much of the peak the tensors themselves hold.

    python benchmarks/step_memory.py [--dtypes bfloat16,float32] [--tokens 4000] [--rows 2]

Allocators: `jemalloc` (preloaded, as the `longhaul` command starts itself where libjemalloc2 is
installed), `glibc-kept` (mmap and trimming off: `LONGHAUL_MALLOC=glibc`), `glibc-kept-bounded`
(the same with the free heap bounded between layers too, `LONGHAUL_MALLOC_FREE_GB`), and `live`. Writes
benchmarks/results/step_memory.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "step_memory.json"

# name -> (environment, glibc M_MMAP_THRESHOLD in MB or None, keep glibc's freed memory)
ALLOCATORS = {
    "jemalloc": ({"LONGHAUL_MALLOC": "keep"}, None, True),
    "glibc-kept": ({"LONGHAUL_MALLOC": "glibc"}, None, True),
    "glibc-kept-bounded": ({"LONGHAUL_MALLOC": "glibc", "BOUND": "1"}, None, True),  # bounded between layers too
    "live": ({"LONGHAUL_MALLOC": "system"}, 1, False),  # glibc, every buffer over 1 MB mapped and unmapped
}


def worker(dtype: str, tokens: int, rows: int, iters: int, mmap_mb: int | None, keep: bool, bound: bool, free_gb: float) -> None:
    """One allocator's run, in this process: prints one JSON line a micro-batch."""
    import ctypes

    from longhaul import malloc

    if mmap_mb is not None:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, mmap_mb << 20)  # M_MMAP_THRESHOLD: fixed, so larger buffers are mapped each time
        libc.mallopt(-1, mmap_mb << 21)  # M_TRIM_THRESHOLD
    if keep:
        malloc.keep_freed_memory()
    os.environ["LONGHAUL_MALLOC_FREE_GB"] = str(free_gb)
    if not bound:
        malloc.within_step = lambda: 0  # noqa: E731  (the training loop's bound between steps stays)
        from longhaul.rl import packed_forward

        packed_forward.within_step = malloc.within_step
    import torch

    from longhaul.models.loader import load_policy
    from longhaul.models.lora import apply_lora
    from longhaul.rl.logprobs import completion_logprobs

    model, _ = load_policy("smollm2-135m-instruct")
    model = apply_lora(model, 16, 32, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                       "smollm2-135m-instruct")
    gen = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(0, 40000, (300,), generator=gen).tolist(), torch.randint(0, 40000, (tokens - 300,), generator=gen).tolist())
             for _ in range(rows)]
    autocast = "bfloat16" if dtype == "bfloat16" else "none"

    def status() -> dict:
        d = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return {k: int(d[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

    for it in range(iters):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark to the current resident figure
        before = status()["VmRSS"]
        t = time.perf_counter()
        lp, mask, _ = completion_logprobs(model, pairs, 0, 1.0, autocast, True, False, fast=True)
        (lp * mask).sum().backward()
        seconds = time.perf_counter() - t
        peak = status()["VmHWM"]
        model.zero_grad(set_to_none=True)
        del lp, mask
        trimmed = malloc.between_steps().get("memory/trimmed_gb", 0.0)
        print(json.dumps({"iter": it, "seconds": seconds, "before_gb": before / 1e9, "peak_gb": peak / 1e9,
                          "after_gb": status()["VmRSS"] / 1e9, "trimmed_gb": trimmed, "allocator": malloc.allocator()}), flush=True)


def run_one(name: str, dtype: str, args) -> list[dict]:
    from longhaul.malloc import preload_env

    extra, mmap_mb, keep = ALLOCATORS[name]
    env = {**os.environ, **extra}
    env.pop("LD_PRELOAD", None)
    env.pop("LONGHAUL_MALLOC_PRELOADED", None)
    if name == "jemalloc":
        os.environ["LONGHAUL_MALLOC"] = "keep"
        pre = preload_env()
        if not pre:
            print("jemalloc: libjemalloc2 is not installed (apt-get install libjemalloc2); skipped", file=sys.stderr)
            return []
        env.update(pre)
    cmd = [sys.executable, __file__, "--worker", dtype, str(args.tokens), str(args.rows), str(args.iters),
           "" if mmap_mb is None else str(mmap_mb), "1" if keep else "0", extra.get("BOUND", "0"), str(args.free_gb)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{name} / {dtype} failed:\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        print(f"  {name:20s} {dtype:9s} micro-batch {r['iter'] + 1}: peak {r['peak_gb']:.2f} GB, {r['seconds']:.1f} s", file=sys.stderr)
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        worker(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]) if a[4] else None, a[5] == "1", a[6] == "1", float(a[7]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS), help="comma-separated names from: " + "; ".join(ALLOCATORS))
    ap.add_argument("--tokens", type=int, default=4000, help="tokens an episode")
    ap.add_argument("--rows", type=int, default=2, help="episodes a micro-batch (the main job's RL stage: 2)")
    ap.add_argument("--iters", type=int, default=2, help="micro-batches a run; the last is the steady state")
    ap.add_argument("--free-gb", type=float, default=2.0, help="LONGHAUL_MALLOC_FREE_GB (the pipeline's stages: 2)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.common import host

    names = [n.strip() for n in args.allocators.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALLOCATORS]
    if unknown:
        raise SystemExit(f"unknown allocator {unknown[0]!r}; choose from: " + "; ".join(ALLOCATORS))
    results = {}
    for dtype in args.dtypes.split(","):
        for name in names:
            rows = run_one(name, dtype, args)
            if rows:
                results.setdefault(dtype, {})[name] = rows
    print(f"\nhost: {host()}; {args.rows} x {args.tokens} tokens, SmolLM2-135M + LoRA r16, one forward + backward")
    print(f"{'dtype':9s} {'allocator':20s} {'peak GB':>8s} {'s':>6s} {'peak vs live':>12s}")
    for dtype, by in results.items():
        live = by.get("live")
        for name, rows in by.items():
            last = rows[-1]
            ratio = f"{last['peak_gb'] / live[-1]['peak_gb']:.2f}x" if live else "-"
            print(f"{dtype:9s} {name:20s} {last['peak_gb']:8.2f} {last['seconds']:6.1f} {ratio:>12s}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"host": host(), "tokens": args.tokens, "rows": args.rows, "iters": args.iters,
                               "free_gb": args.free_gb, "results": results}, indent=2))
    tmp.replace(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
