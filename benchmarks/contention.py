"""Engine throughput when the machine is shared: alone, and beside 1 and 2 busy processes.

Each busy process is `python -c "while True: pass"`, as a browser tab, a CI job or a pod
neighbour would be. For each dtype and batch size the engine generates exactly `--tokens` new
tokens a sequence (sampling at T=1, `ignore_eos`, the prompts of `longhaul bench engine`) with
the thread governor on (the default) and off (a fixed thread count: the cores torch sees), and
once with one thread as the floor to compare against. Throughput is generated tokens over the
wall time of the `generate` call, prefill included; each figure is the median of `--repeats`
runs after one warm-up (the median, not the best: contention is what is measured), the three
modes taking turns run by run.

    python benchmarks/contention.py [--dtypes float32,bfloat16] [--batches 1,8,32] [--tokens 128]

Writes benchmarks/results/contention.json and prints a table with each figure's ratio to the
same configuration alone.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from longhaul.cpus import available_cpus
from longhaul.inference.bench import fib_prompts
from longhaul.inference.engine import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.inference.threads import ThreadGovernor
from longhaul.models import load_policy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import host, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "contention.json"


@contextmanager
def busy(n: int):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0)  # let the scheduler see them
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def tok_s(engine: LLMEngine, prompts, tokens: int, seed: int) -> float:
    engine.flush_prefix_cache()
    params = [SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=seed * 1000 + i) for i in range(len(prompts))]
    t = time.perf_counter()
    n = sum(len(o.token_ids) for o in engine.generate(prompts, params))
    return n / (time.perf_counter() - t)


MODES = ("governed", "fixed", "one_thread")


def run(model: str, dtypes: list[str], batches: list[int], loads: list[int], tokens: int, repeats: int) -> dict:
    hf, tok = load_policy(model)
    prompts = fib_prompts(tok, max(64, max(batches)))
    cores = torch.get_num_threads()
    rows = []
    for dtype in dtypes:
        engine = LLMEngine(hf, dtype=dtype, tokenizer=tok)
        engine.generate(prompts[:2], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
        for load in loads:
            with busy(load):
                for b in batches:
                    row = {"dtype": dtype, "batch_size": b, "busy_processes": load}
                    governor, rates = ThreadGovernor(), {m: [] for m in MODES}
                    for r in range(repeats):  # the modes take turns, so that a drift in the host's speed hits each alike
                        for mode in MODES:
                            engine.threads = governor if mode == "governed" else None
                            torch.set_num_threads(1 if mode == "one_thread" else cores)
                            rates[mode].append(tok_s(engine, prompts[:b], tokens, r))
                            torch.set_num_threads(cores)
                    for mode in MODES:
                        row[mode] = round(statistics.median(rates[mode]), 1)
                    row["governor_choice"] = governor.choice
                    rows.append(row)
                    print(f"{dtype:9s} b{b:<3d} busy {load}: " + "  ".join(f"{m} {row[m]:7.1f}" for m in MODES), flush=True)
    alone = {(r["dtype"], r["batch_size"]): r for r in rows if r["busy_processes"] == 0}
    for r in rows:
        base = alone.get((r["dtype"], r["batch_size"]))
        if base:
            r["governed_vs_alone"] = round(r["governed"] / base["governed"], 3)
            r["fixed_vs_alone"] = round(r["fixed"] / base["fixed"], 3)
            r["governed_vs_one_thread"] = round(r["governed"] / r["one_thread"], 3)
    return {"model": model, "tokens": tokens, "repeats": repeats, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": {"host": host(), "available_cpus": available_cpus(), "threads": cores, "torch": torch.__version__},
            "rows": rows}


def table(result: dict) -> str:
    out = [f"{result['model']}, {result['tokens']} new tokens, {result['machine']['host']}, {result['machine']['threads']} threads",
           f"{'dtype':9s} {'batch':>5s} {'busy':>4s} {'governed':>9s} {'fixed':>8s} {'1 thread':>9s} {'gov/alone':>10s} "
           f"{'fixed/alone':>12s} {'gov/1thr':>9s}"]
    for r in result["rows"]:
        out.append(f"{r['dtype']:9s} {r['batch_size']:5d} {r['busy_processes']:4d} {r['governed']:9.1f} {r['fixed']:8.1f} "
                   f"{r['one_thread']:9.1f} {r.get('governed_vs_alone', 0):10.2f} {r.get('fixed_vs_alone', 0):12.2f} "
                   f"{r.get('governed_vs_one_thread', 0):9.2f}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--busy", default="0,1,2", help="numbers of busy processes to run beside the engine")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    result = run(a.model, a.dtypes.split(","), [int(b) for b in a.batches.split(",")], [int(x) for x in a.busy.split(",")],
                 a.tokens, a.repeats)
    print(table(result))
    write_json(result, a.out)


if __name__ == "__main__":
    main()
