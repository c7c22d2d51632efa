"""A two-role team trained from SmolLM2-135M-Instruct, against the untrained team, a single agent
from the same base trained the same way under the same budgets, and one LoRA adapter a role: the
figures `longhaul team train` is judged by.

Runs `longhaul team train CONFIG compare=[...]` in this process (a stage whose output exists is
not run again, so an interrupted or finished run is picked up where it stands), then writes
benchmarks/results/multi_agent.json: each stage's held-out pass@1 (greedy, the same tasks every
stage and variant) with its 95% interval, the exact McNemar tests, the tokens each role wrote,
the seconds each stage took (training = demonstrations + SFT + RL; the evaluations apart), and
the host. Prints the table docs/results/multi_agent.md renders.

    python benchmarks/multi_agent.py [--config examples/team.yaml] [--compare single,adapters] [--out PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import host, write_json  # noqa: E402


def stage_rows(name: str, summary: dict) -> list[dict]:
    return [{"run": name, "stage": stage, "passed": row["passed"], "n": row["n"], "pass_rate": row["pass_rate"],
             "ci95": row["ci95"], "infra_errors": row["infra_errors"], "tokens": sum(r["tokens"] for r in row["roles"].values()),
             "roles": {role: r["tokens"] for role, r in row["roles"].items()}} for stage, row in summary["stages"].items()]


def seconds(timing: dict) -> dict:
    """Training (demonstrations, SFT, RL) apart from the evaluations that measure it."""
    train = sum(v for k, v in timing.items() if k == "demos" or k.startswith(("sft", "rl")))
    evals = sum(v for k, v in timing.items() if k.startswith("eval_"))
    return {"training": round(train, 1), "evaluation": round(evals, 1), "stages": timing}


def result(summary: dict, command: str) -> dict:
    runs = {summary["policies"]: summary, **summary.get("compared", {})}
    rows = [r for name, s in runs.items() for r in stage_rows(name, s)]
    tests = {k: v for s in runs.values() for k, v in s.items() if "_vs_" in k}
    return {"command": command, "host": host(), "measured_at": summary["measured_at"], "workflow": summary["workflow"],
            "family": summary["family"], "model": summary["model"], "held_out": rows[0]["n"], "rows": rows, "tests": tests,
            "seconds": {name: seconds(s["timing_s"]) for name, s in runs.items()},
            "budgets": summary["config"]["budgets"], "subfamilies": summary["config"]["subfamilies"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(HERE.parent / "examples" / "team.yaml"))
    ap.add_argument("--compare", default="single,adapters", help="variants, comma-separated (single, shared, per_role, adapters)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "multi_agent.json")
    args = ap.parse_args(argv)
    from longhaul.config import load_config
    from longhaul.runtime.team_train import TeamTrainConfig, train_team

    compare = [v for v in args.compare.split(",") if v]
    overrides = [f"compare=[{', '.join(compare)}]"] if compare else []
    summary = train_team(load_config(args.config, overrides, model=TeamTrainConfig))
    config = Path(args.config).resolve()
    shown = config.relative_to(HERE.parent) if config.is_relative_to(HERE.parent) else config
    command = f"longhaul team train {shown} {' '.join(repr(o) for o in overrides)}".strip()
    res = result(summary, command)
    for r in res["rows"]:
        lo, hi = r["ci95"]
        print(f"{r['run']:>9} {r['stage']:>5}: {r['passed']}/{r['n']} [{100 * lo:.0f}-{100 * hi:.0f}%], {r['tokens']:,} tokens")
    for k, m in res["tests"].items():
        print(f"{k}: gained {m['gained']}, lost {m['lost']}, exact McNemar p = {m['p_value']:.3g}")
    write_json(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
