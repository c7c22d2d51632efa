"""The longhaul placer vs FIFO on a simulated 1,000-node cluster shared by 300 domains.

One synthetic workload (benchmarks/sim/workload.py: its assumptions are stated
there and in docs/scheduling.md) is replayed through each policy by the discrete-event
simulator (cluster_sim). Prints a table (GPU and CPU utilisation, goodput, p50/p90/p99
queueing delay, fairness error vs the weights, pre-emptions), checks the goal (higher
utilisation, fairness within 5% of the weights, lower p99 delay than FIFO), writes JSON and an
HTML report with SVG plots.

    python benchmarks/scheduler_sim.py [--hours 72] [--nodes 1000] [--domains 300] [--seed 0]
        [--policies longhaul,fifo,fifo_backfill,'longhaul[fair_preempt_after_s=600]'] [--load 0.85]
        [--out benchmarks/results/scheduler_sim.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import os
import sys
import time
from pathlib import Path

import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from longhaul.eval.svg import bar_chart, line_chart
from longhaul.placement.cluster import Resources
from longhaul.placement.placer import PRESETS, PlacerConfig
from longhaul.runtime.progress import console, progress_bar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for `benchmarks.sim`
from benchmarks.sim import cluster_sim  # noqa: E402
from benchmarks.sim.workload import (CHECKPOINT_EVERY_S, NOTICE_OVERHEAD_S, REPLICA_LEAVE_S, SAVES_ON_NOTICE,  # noqa: E402
                                     STORAGE_GBPS, TRAIN_STATE_X, WorkloadSpec, make_workload)

GPU_WORKER_CPUS_PER_GPU = 6  # what the workload's GPU workers ask (workload._job): the placer keeps that many beside a free GPU
FAIRNESS_GOAL = 0.05  # the goal: fairness within 5% of the weights, in 6 h and 1 h windows


def policy_config(entry: str):
    """`name` (a preset) or `name[key=value;...]` (a preset with PlacerConfig overrides)."""
    name, _, rest = entry.partition("[")
    if name not in PRESETS:
        raise SystemExit(f"error: unknown policy {name!r}; choose from {', '.join(PRESETS)}")
    cfg = PRESETS[name]
    if cfg.policy == "pack":
        cfg = cfg.model_copy(update={"cpus_per_gpu": GPU_WORKER_CPUS_PER_GPU})
    overrides = {k.strip(): yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in rest.rstrip("]").split(";") if kv.strip())}
    try:
        return PlacerConfig.model_validate({**cfg.model_dump(), **overrides})
    except ValidationError as e:
        raise SystemExit(f"error: policy {entry!r}: {e.errors()[0]['msg']} ({'.'.join(map(str, e.errors()[0]['loc']))})") from None


def run_policies(spec: WorkloadSpec, policies: list[str], tick_s: float, show: bool = True) -> tuple[dict, dict]:
    nodes, domains, jobs = make_workload(spec)
    workload = {"jobs": len(jobs), "gpus": sum(n.capacity.gpus for n in nodes), "cpus": sum(n.capacity.cpus for n in nodes),
                "offered_gpu_hours": sum(j.job.total[2] * j.work_s for j in jobs) / 3600,
                "offered_cpu_hours": sum(Resources.of(j.job.total).cpus * j.work_s for j in jobs) / 3600}
    workload["offered_gpu_load"] = offered_gpu_load(workload, spec.hours)
    results = {}
    with progress_bar(show) as prog:
        for name in policies:
            cfg = policy_config(name)
            bar = prog.add_task(escape(f"{name:>13}"), total=spec.hours, info="simulated hours")
            last = [0.0]

            def progress(now, bar=bar):
                if now - last[0] >= 600:
                    last[0] = now
                    prog.update(bar, completed=min(now, spec.hours * 3600) / 3600)
            t0 = time.perf_counter()
            r = cluster_sim.simulate(nodes, domains, jobs, cfg, spec.warmup_hours * 3600, spec.hours * 3600, progress, tick_s)
            prog.update(bar, completed=spec.hours)
            results[name] = {**r, "config": cfg.model_dump(), "wall_s": time.perf_counter() - t0}
    return workload, results


def offered_gpu_load(workload: dict, hours: float) -> float:
    """The GPU load a draw offers: its GPU-hours of work over the GPUs x the hours of arrivals
    (the spec's `load` is only the mean the arrival rate is set for)."""
    return workload["offered_gpu_hours"] / (workload["gpus"] * hours)


def goal(results: dict, baseline: str = "fifo", policy: str = "longhaul") -> dict:
    ours, base = results.get(policy), results.get(baseline)
    if not ours or not base:
        return {}
    return {"higher_gpu_utilisation": ours["gpu_utilisation"] > base["gpu_utilisation"],
            "higher_cpu_utilisation": ours["cpu_utilisation"] > base["cpu_utilisation"],
            "higher_gpu_goodput": ours["gpu_goodput"] > base["gpu_goodput"],
            "higher_gpu_utilisation_backlogged": _backlogged_gpu(ours, base) > _backlogged_gpu(base, ours),
            "fairness_within_5pct": ours["fairness_error"] <= FAIRNESS_GOAL and ours["fairness_error_1h"] <= FAIRNESS_GOAL,  # 6 h and 1 h windows
            "fairness_within_5pct_waits": ours["fairness_error_waits"] <= FAIRNESS_GOAL,
            "lower_p99_delay": ours["delay_p99_s"] < base["delay_p99_s"], "baseline": baseline}


def _backlogged_gpu(r: dict, other: dict) -> float:
    """`r`'s allocated GPU fraction over the hours both runs had jobs waiting (0 if none)."""
    both = [h for h, (a, b) in enumerate(zip(r["backlogged_hourly"], other["backlogged_hourly"])) if a and b]
    return sum(r["gpu_utilisation_hourly"][h] for h in both) / len(both) if both else 0.0


def print_table(results: dict) -> None:
    t = Table(title="placement policies on the simulated cluster (measured window)")
    for col in ("policy", "GPU util", "backlogged", "CPU util", "goodput", "p50 delay", "p90", "p99", "p99 by priority", "fairness 6h",
                "fairness 1h", "waits 6h", "pre-empt", "GPU-h lost", "most evictions (kills) of a job", "waiting at end", "wall s"):
        t.add_column(col, justify="right")
    for name, r in results.items():
        t.add_row(escape(name), f"{100 * r['gpu_utilisation']:.1f}%", _percent(r["gpu_utilisation_backlogged"]),
                  f"{100 * r['cpu_utilisation']:.1f}%", f"{100 * r['gpu_goodput']:.1f}%",
                  _minutes(r["delay_p50_s"]), _minutes(r["delay_p90_s"]), _minutes(r["delay_p99_s"]),
                  " / ".join(f"{v / 60:.0f}" for v in r["delay_p99_by_priority_s"].values()), f"{r['fairness_error']:.3f}",
                  f"{r['fairness_error_1h']:.3f}", f"{r['fairness_error_waits']:.3f}", str(r["preemptions"]),
                  f"{r['preempted_gpu_hours_lost']:.0f}", f"{r['evictions_most_of_one_job']} ({r['kills_most_of_one_job']})", str(r["jobs_waiting_at_end"]), f"{r['wall_s']:.0f}")
    Console(width=max(console.width, 190), highlight=False).print(t)


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _minutes(s: float) -> str:
    return f"{s / 60:.1f} min"


def _assumptions(spec: WorkloadSpec, workload: dict, tick_s: float) -> list[str]:
    return [f"{spec.nodes} nodes in {spec.racks} racks ({workload['gpus']} GPUs, {workload['cpus']:.0f} CPUs); {spec.domains} domains",
            f"{workload['jobs']} jobs over {spec.hours:g} h (first {spec.warmup_hours:g} h not measured); offered load {spec.load:g} x GPU "
            f"capacity on average, daily cycle +-{100 * spec.diurnal:.0f}%, {100 * spec.sweep_prob:.0f}% of arrivals are sweeps of 5-40 jobs",
            f"offered work: {workload['offered_gpu_hours']:.0f} GPU-h, {workload['offered_cpu_hours']:.0f} CPU-h (before checkpoint loads); "
            f"this draw offers {workload['offered_gpu_load']:.3f} x the GPU capacity",
            "checkpoint loads: node cache %g GB/s, same rack %g GB/s, storage %g GB/s; a gang spanning r racks runs 1 + %g (r - 1) "
            "times slower (%g below 32 GB)" % (cluster_sim.LOCAL_GBPS, cluster_sim.RACK_GBPS, cluster_sim.REMOTE_GBPS,
                                                cluster_sim.CROSS_RACK_LARGE, cluster_sim.CROSS_RACK_SMALL),
            f"pre-empted work survives at checkpoints every {', '.join(f'{k} {v / 60:g} min' for k, v in CHECKPOINT_EVERY_S.items())}",
            (f"told of a pre-emption, {', '.join(k for k, v in SAVES_ON_NOTICE.items() if v)} runs save everything instead "
             f"({TRAIN_STATE_X:g}x the checkpoint at {STORAGE_GBPS:g} GB/s + {NOTICE_OVERHEAD_S:g} s, holding their GPUs meanwhile)"
             if spec.notice_save_s is None else f"what-if: told of a pre-emption, every job saves everything in {spec.notice_save_s:g} s"),
            *([f"training runs are data-parallel replicas a node: with split_elastic they grow and shrink; a replica leaving or "
               f"joining costs its peers {REPLICA_LEAVE_S:g} s to regroup, one joining copies {TRAIN_STATE_X:g}x the checkpoint from a "
               f"peer, the last one saves alone"] if spec.replicated_training else []),
            f"one placer pass every {tick_s:g} s; seed {spec.seed}"]


def write_html(path: Path, spec: WorkloadSpec, workload: dict, results: dict, verdict: dict, tick_s: float) -> None:
    names = list(results)
    charts = [
        bar_chart(["GPU util", "GPU util, backlogged hours", "CPU util", "GPU goodput"],
                  {n: [results[n][k] or 0.0 for k in ("gpu_utilisation", "gpu_utilisation_backlogged", "cpu_utilisation", "gpu_goodput")]
                   for n in names}, "utilisation (fraction of capacity)"),
        bar_chart(["p50", "p90", "p99"], {n: [results[n][k] / 60 for k in ("delay_p50_s", "delay_p90_s", "delay_p99_s")] for n in names},
                  "queueing delay (minutes)", "minutes"),
        bar_chart(["6 h windows", "worst 6 h", "1 h windows", "6 h, every wait as demand", "the same, capped"],
                  {n: [results[n][k] for k in ("fairness_error", "fairness_error_worst_window", "fairness_error_1h", "fairness_error_waits",
                                               "fairness_error_capped")]
                   for n in names},
                  "fairness error vs the weights (0 = exact)"),
        line_chart({n: (list(range(len(results[n]["gpu_utilisation_hourly"]))), results[n]["gpu_utilisation_hourly"]) for n in names},
                   "GPU utilisation by hour of the window", "hour", "allocated GPU fraction", y_min=0.0, y_max=1.0),
        line_chart({n: (list(range(len(results[n]["fairness_hourly"]))), results[n]["fairness_hourly"]) for n in names},
                   "fairness error by hour", "hour", "sum |share - entitlement|", y_min=0.0),
        line_chart({n: (list(range(101)), [q / 60 for q in results[n]["delay_quantiles_s"]]) for n in names},
                   "queueing delay by percentile", "percentile of jobs", "minutes", y_min=0.0),
    ]
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{100 * r['gpu_utilisation']:.1f}%</td><td>{_percent(r['gpu_utilisation_backlogged'])}</td>"
        f"<td>{100 * r['cpu_utilisation']:.1f}%</td>"
        f"<td>{100 * r['gpu_goodput']:.1f}%</td><td>{r['delay_p50_s'] / 60:.1f}</td><td>{r['delay_p99_s'] / 60:.1f}</td>"
        f"<td>{', '.join(f'p{k}: {v / 60:.0f}' for k, v in r['delay_p99_by_priority_s'].items())}</td><td>{r['fairness_error']:.3f}</td>"
        f"<td>{r['fairness_error_1h']:.3f}</td><td>{r['fairness_error_waits']:.3f}</td>"
        f"<td>{r['preemptions']}</td><td>{r['preempted_gpu_hours_lost']:.0f}</td></tr>" for n, r in results.items())
    table = ("<table border='1' cellpadding='4' style='border-collapse:collapse'><tr><th>policy</th><th>GPU util</th><th>GPU util, backlogged hours</th><th>CPU util</th>"
             "<th>goodput</th><th>p50 min</th><th>p99 min</th><th>p99 min by priority</th><th>fairness 6 h</th><th>fairness 1 h</th><th>6 h, every wait as demand</th><th>pre-emptions</th>"
             "<th>GPU-h lost</th></tr>" + rows + "</table>")
    goal_html = "".join(f"<li>{html.escape(k)}: <b>{v}</b></li>" for k, v in verdict.items())
    body = (f"<h1>Placement on a simulated {spec.nodes}-node cluster</h1><h2>Assumptions</h2><ul>"
            + "".join(f"<li>{html.escape(a)}</li>" for a in _assumptions(spec, workload, tick_s)) + "</ul><h2>Results</h2>" + table
            + f"<h3>Goal vs FIFO</h3><ul>{goal_html}</ul><div style='display:flex;flex-wrap:wrap;gap:12px'>{''.join(charts)}</div>")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>scheduler simulation</title></head><body style='font-family:sans-serif'>{body}</body></html>"
    _atomic_write(path, page)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=72.0)
    ap.add_argument("--warmup", type=float, default=6.0, help="hours not measured (the cluster starts empty)")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--racks", type=int, default=40)
    ap.add_argument("--domains", type=int, default=300)
    ap.add_argument("--load", type=float, default=WorkloadSpec.load, help="mean offered GPU load / GPU capacity")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--notice-save-s", type=float, default=None,
                    help="what-if: every job saves on notice in this many seconds (1: pre-emption nearly free); default: as modelled")
    ap.add_argument("--replicated-training", action="store_true",
                    help="training runs are data-parallel replicas a node that a placer with split_elastic grows and shrinks "
                         "(measured, not the default: docs/scheduling.md)")
    ap.add_argument("--tick", type=float, default=cluster_sim.TICK_S, help="seconds between placer passes")
    ap.add_argument("--policies", default="longhaul,fifo,fifo_backfill",
                    help="presets, optionally with overrides: longhaul[fair_preempt_after_s=600;preempt=false]")
    ap.add_argument("--out", default="benchmarks/results/scheduler_sim.json")
    ap.add_argument("--html", default=None, help="default: the --out path with .html")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        policy_config(p)  # fail before simulating anything
    if args.notice_save_s is not None and not args.notice_save_s >= 0:
        raise SystemExit(f"error: --notice-save-s {args.notice_save_s:g} must be 0 or more seconds")
    if args.warmup >= args.hours:
        raise SystemExit(f"error: --warmup {args.warmup:g} must be shorter than --hours {args.hours:g}")
    spec = WorkloadSpec(nodes=args.nodes, racks=args.racks, domains=args.domains, hours=args.hours, warmup_hours=args.warmup,
                        load=args.load, seed=args.seed, notice_save_s=args.notice_save_s, replicated_training=args.replicated_training)
    workload, results = run_policies(spec, policies, args.tick)
    print_table(results)
    verdict = goal(results)
    for k, v in verdict.items():
        if k != "baseline":
            console.print(f"goal {k}: {'[green]yes[/]' if v else '[red]no[/]'}")
    out = Path(args.out)
    data = {"spec": dataclasses.asdict(spec), "tick_s": args.tick, "workload": workload, "assumptions": _assumptions(spec, workload, args.tick),
            "results": results, "goal": verdict}
    _atomic_write(out, json.dumps(data, indent=1) + "\n")
    page = Path(args.html) if args.html else out.with_suffix(".html")
    write_html(page, spec, workload, results, verdict, args.tick)
    console.print(f"wrote {out} and {page}")
    return data


if __name__ == "__main__":
    main()
