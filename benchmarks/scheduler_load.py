"""The placer against FIFO by offered load: gathers runs of `scheduler_sim.py` (one JSON each,
any seeds and `--load`s), orders them by the GPU load each draw offers, and prints a table,
writes a JSON and an HTML page with the fairness error, the p99 delay and the jobs left
waiting against that load.

    python benchmarks/scheduler_load.py benchmarks/results/scheduler_sim.json benchmarks/results/scheduler_sim_seed[123].json \
        benchmarks/results/scheduler_sim_seed*_load*.json

The workload's `load` is the mean the arrival rate is set for; each draw offers its own amount
of work (`offered_gpu_load`: its GPU-hours of work over the GPUs x hours), and that, not the
seed, is what the fairness error follows (docs/scheduling.md, "What holds seed 2 above 0.05").
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path

from rich.table import Table

from longhaul.eval.svg import line_chart
from longhaul.runtime.progress import console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scheduler_sim import FAIRNESS_GOAL as GOAL, _atomic_write, goal, offered_gpu_load  # noqa: E402

# all of them: the goal met. Utilisation is judged over the hours both runs had jobs waiting: where both finish every
# job, both do the same work and FIFO's extra allocation is checkpoint loads (goodput is in the table)
MET = ("fairness_within_5pct", "lower_p99_delay", "higher_gpu_utilisation_backlogged")


def offered_load(data: dict) -> float:
    """The GPU load a run's draw offers: recorded, or (runs before it was) its offered GPU-hours
    over the GPUs x the hours of arrivals."""
    return data["workload"].get("offered_gpu_load") or offered_gpu_load(data["workload"], data["spec"]["hours"])


def row(path: Path, data: dict, policy: str, baseline: str) -> dict:
    if policy not in data["results"] or baseline not in data["results"]:
        raise SystemExit(f"error: {path} has no {policy!r} or {baseline!r} run (it has {', '.join(data['results'])}); "
                         f"run scheduler_sim.py with --policies {policy},{baseline}, or pass --policy / --baseline")
    r, b = data["results"][policy], data["results"][baseline]
    spec, verdict = data["spec"], goal(data["results"], baseline, policy)
    return {"file": str(path), "seed": spec["seed"], "load": spec["load"], "notice_save_s": spec.get("notice_save_s"),
            "offered_gpu_load": offered_load(data),
            **{f"{k}_{who}": x[k] for who, x in (("policy", r), ("baseline", b))
               for k in ("fairness_error", "fairness_error_1h", "delay_p99_s", "jobs_waiting_at_end", "gpu_goodput")},
            "goal": verdict, "goal_met": all(verdict[k] for k in MET)}


def load(paths: list[str], policy: str, baseline: str) -> list[dict]:
    rows = []
    for p in map(Path, paths):
        try:
            data = json.loads(p.read_text())
            data["workload"], data["spec"], data["results"]  # noqa: B018 (a scheduler_sim run has all three)
        except FileNotFoundError:
            raise SystemExit(f"error: {p} does not exist; pass the JSON files scheduler_sim.py wrote (--out)") from None
        except (json.JSONDecodeError, KeyError, TypeError):
            raise SystemExit(f"error: {p} is not a scheduler_sim.py result (no workload, spec and results); "
                             f"pass the JSON files scheduler_sim.py wrote (--out)") from None
        rows.append(row(p, data, policy, baseline))
    return sorted(rows, key=lambda x: (x["offered_gpu_load"], x["file"]))


def print_table(rows: list[dict], policy: str, baseline: str) -> None:
    t = Table(title=f"{policy} ({baseline}) by offered GPU load; goal: fairness <= {GOAL} in 6 h and 1 h windows, "
                    f"lower p99, more GPUs allocated while both have jobs waiting")
    for c in ("seed@load", "offered", "fairness 6h/1h", "p99 min", "goodput %", "goal"):
        t.add_column(c, no_wrap=True)
    for x in rows:
        what = f"{x['seed']}@{x['load']:g}" + (f", saves {x['notice_save_s']:g} s" if x["notice_save_s"] is not None else "")
        t.add_row(what, f"{x['offered_gpu_load']:.3f}", f"{x['fairness_error_policy']:.3f} / {x['fairness_error_1h_policy']:.3f}",
                  f"{x['delay_p99_s_policy'] / 60:.0f} ({x['delay_p99_s_baseline'] / 60:.0f})",
                  f"{100 * x['gpu_goodput_policy']:.1f} ({100 * x['gpu_goodput_baseline']:.1f})", "met" if x["goal_met"] else "not met")
    console.print(t)


def write_html(path: Path, rows: list[dict], policy: str, baseline: str) -> None:
    real = [x for x in rows if x["notice_save_s"] is None]  # the what-if runs (saves of a set length) are in the table only
    xs = [x["offered_gpu_load"] for x in real]
    charts = [
        line_chart({f"{policy}, 6 h": (xs, [x["fairness_error_policy"] for x in real]),
                    f"{policy}, 1 h": (xs, [x["fairness_error_1h_policy"] for x in real]),
                    "goal": (xs[:1] + xs[-1:], [GOAL] * min(len(xs), 2))},  # rows come sorted by load
                   "fairness error by offered load", "offered GPU load (x capacity)", "error", y_min=0.0),
        line_chart({f"{baseline}, 6 h": (xs, [x["fairness_error_baseline"] for x in real]),
                    f"{baseline}, 1 h": (xs, [x["fairness_error_1h_baseline"] for x in real])},
                   f"{baseline}'s fairness error by offered load", "offered GPU load (x capacity)", "error", y_min=0.0),
        line_chart({policy: (xs, [x["delay_p99_s_policy"] / 60 for x in real]),
                    baseline: (xs, [x["delay_p99_s_baseline"] / 60 for x in real])},
                   "p99 queueing delay by offered load", "offered GPU load (x capacity)", "minutes", y_min=0.0),
    ]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ("run", "seed", "--load", "offered load", "fairness 6 h", "1 h",
                                                          f"{baseline} 6 h", f"{baseline} 1 h", "p99 min", f"{baseline} p99 min", "goal"))
    body_rows = "".join(
        f"<tr><td>{html.escape(Path(x['file']).name)}</td><td>{x['seed']}</td><td>{x['load']:g}</td><td>{x['offered_gpu_load']:.3f}</td>"
        f"<td>{x['fairness_error_policy']:.3f}</td><td>{x['fairness_error_1h_policy']:.3f}</td>"
        f"<td>{x['fairness_error_baseline']:.3f}</td><td>{x['fairness_error_1h_baseline']:.3f}</td>"
        f"<td>{x['delay_p99_s_policy'] / 60:.0f}</td><td>{x['delay_p99_s_baseline'] / 60:.0f}</td>"
        f"<td>{'met' if x['goal_met'] else 'not met'}</td></tr>" for x in rows)
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>placer by offered load</title></head>"
            f"<body style='font-family:sans-serif'><h1>{html.escape(policy)} against {html.escape(baseline)} by offered GPU load</h1>"
            f"<table border='1' cellpadding='4' style='border-collapse:collapse'><tr>{head}</tr>{body_rows}</table>"
            f"<div style='display:flex;flex-wrap:wrap;gap:12px'>{''.join(charts)}</div></body></html>")
    _atomic_write(path, page)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="JSON files written by scheduler_sim.py")
    ap.add_argument("--policy", default="longhaul")
    ap.add_argument("--baseline", default="fifo")
    ap.add_argument("--out", default="benchmarks/results/scheduler_load.json")
    ap.add_argument("--html", default=None, help="default: the --out path with .html")
    args = ap.parse_args(argv)
    rows = load(args.runs, args.policy, args.baseline)
    print_table(rows, args.policy, args.baseline)
    out = Path(args.out)
    _atomic_write(out, json.dumps({"policy": args.policy, "baseline": args.baseline, "goal_fairness": GOAL, "runs": rows}, indent=1))
    page = Path(args.html) if args.html else out.with_suffix(".html")
    write_html(page, rows, args.policy, args.baseline)
    console.print(f"wrote {out} and {page}")
    return rows


if __name__ == "__main__":
    main()
