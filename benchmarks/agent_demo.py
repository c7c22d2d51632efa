"""The agent pipeline's recorded run, and the ablations that say what each stage adds.

    python benchmarks/agent_demo.py [--config examples/agent.yaml] [--ablations] [--humaneval] [OVERRIDES...]

First the pipeline of `--config` as `make demo` runs it (demonstrations, SFT, RL from the SFT
weights, greedy evaluation of base, SFT and SFT+RL on the same held-out tasks) in
`runs/<name>`; a finished run is read back, not repeated. With `--ablations`, two more runs
on the same held-out tasks, each in `runs/<name>_<ablation>` and starting from the main run's
demonstrations and base evaluation:
- `rl_from_base`: the same RL stage from the base model, no cold start (`stages: [rl]`);
- `sft_same_wall_clock`: SFT alone for the main run's SFT + RL wall clock (its steps scaled by
  that ratio, or `--sft-steps`, `stages: [sft]`).
Each ablation is compared with the main run's SFT+RL policy by an exact McNemar test on the
paired tasks. `--humaneval` adds HumanEval pass@1 of the base and final policies.

Writes benchmarks/results/agent_demo.json (the main run's `pipeline.json` plus `ablations`,
written to a temporary file and renamed) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

from longhaul.config import PipelineConfig, load_config
from longhaul.errors import LonghaulError
from longhaul.eval.stats import mcnemar_exact, wilson
from longhaul.runtime.pipeline import run_pipeline

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "agent_demo.json"
SHARED = ("demos.jsonl", "eval_base.json", "episodes_base.jsonl")


def passed_by_set(run_dir: Path, stage: str) -> dict[str, list[bool]]:
    data = json.loads((run_dir / f"eval_{stage}.json").read_text())
    return {k: [bool(p) for p in v["passed"]] for k, v in data.items()}


def row(passed: list[bool]) -> dict:
    n, k = len(passed), sum(passed)
    return {"passed": k, "n": n, "pass_rate": k / max(1, n), "ci95": list(wilson(k, n))}


def ablation(main: PipelineConfig, main_dir: Path, name: str, update: dict) -> Path:
    cfg = main.model_copy(update={"name": f"{main.name}_{name}", **update})
    run_dir = Path(cfg.output_dir) / cfg.name
    run_dir.mkdir(parents=True, exist_ok=True)
    for f in SHARED:  # the same demonstrations and base evaluation as the main run
        if (main_dir / f).exists() and not (run_dir / f).exists():
            shutil.copy2(main_dir / f, run_dir / f)
    run_pipeline(cfg)
    return run_dir


def compare(main_dir: Path, run_dir: Path, stage: str, sets: list[str], transfer: list[str]) -> dict:
    ours, theirs = passed_by_set(main_dir, "rl"), passed_by_set(run_dir, stage)
    flat = lambda d, keys: [p for k in keys for p in d[k]]  # noqa: E731
    out = {"trained": row(flat(theirs, sets)), "vs_sft_rl": mcnemar_exact(flat(theirs, sets), flat(ours, sets))}
    if transfer:
        out["transfer"] = row(flat(theirs, transfer))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "agent.yaml"))
    ap.add_argument("--ablations", action="store_true", help="also RL from base and SFT for the same wall clock")
    ap.add_argument("--humaneval", action="store_true", help="HumanEval pass@1 of the base and final policies")
    ap.add_argument("--sft-steps", type=int, default=None,
                    help="steps of the SFT-alone ablation (default: the main run's SFT steps scaled by its (SFT + RL) / SFT "
                         "wall clock; set it when that run's clock was not its own, e.g. a stage shared the cores)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("overrides", nargs="*", help="dotted overrides of the pipeline config, e.g. eval.tasks=20")
    args = ap.parse_args()
    over = list(args.overrides) + (["eval.humaneval=true"] if args.humaneval else [])
    cfg = load_config(args.config, over, model=PipelineConfig)
    if cfg.stages != ["sft", "rl"]:
        raise LonghaulError(f"the recorded run is SFT then RL; {args.config} has stages {cfg.stages}: set stages: [sft, rl]")
    summary = run_pipeline(cfg)
    main_dir = Path(cfg.output_dir) / cfg.name
    sets = [k for k in passed_by_set(main_dir, "rl") if k in cfg.families]
    transfer = [k for k in passed_by_set(main_dir, "rl") if "held-out sub-family" in k]
    if args.ablations:
        t = summary["timing_s"]
        ratio = (t["sft"] + t["rl"]) / t["sft"]
        steps = yaml.safe_load((main_dir / "sft" / "config.yaml").read_text())["train"]["steps"]  # what the main run's SFT ran
        long_steps = args.sft_steps or max(steps + 1, round(steps * ratio))
        long_sft = {**cfg.sft, "train": {**cfg.sft.get("train", {}), "steps": long_steps}}
        runs = {"rl_from_base": (ablation(cfg, main_dir, "rl_from_base", {"stages": ["rl"]}), "rl"),
                "sft_same_wall_clock": (ablation(cfg, main_dir, "sft_same_wall_clock", {"stages": ["sft"], "sft": long_sft}), "sft")}
        summary["ablations"] = {name: {**compare(main_dir, d, stage, sets, transfer),
                                       "timing_s": json.loads((d / "pipeline.json").read_text())["timing_s"]}
                                for name, (d, stage) in runs.items()}
        summary["ablations"]["sft_same_wall_clock"]["sft_steps"] = long_sft["train"]["steps"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(tmp, out)
    print_table(summary)
    print(f"wrote {out}")
    return 0


def print_table(summary: dict) -> None:
    print(f"\nhost: {summary.get('host')}")
    print(f"{'policy':<28} {'passed':>8} {'rate':>7} {'95% interval':>15} {'transfer':>9}")
    fmt = lambda r: f"{r['passed']:>4}/{r['n']:<3} {100 * r['pass_rate']:6.1f}% [{100 * r['ci95'][0]:5.1f}, {100 * r['ci95'][1]:5.1f}]"  # noqa: E731
    for stage, r in summary["stages"].items():
        tr = summary["transfer"].get(stage)
        print(f"{stage:<28} {fmt(r)} {tr['passed'] if tr else '-':>5}/{tr['n'] if tr else '-'}")
    for name, a in summary.get("ablations", {}).items():
        tr = a.get("transfer")
        print(f"{name:<28} {fmt(a['trained'])} {tr['passed'] if tr else '-':>5}/{tr['n'] if tr else '-'}"
              f"   vs sft+rl: p = {a['vs_sft_rl']['p_value']:.3g}")
    for key in ("sft_vs_base", "rl_vs_sft"):
        if key in summary:
            m = summary[key]
            print(f"{key}: gained {m['gained']}, lost {m['lost']}, exact McNemar p = {m['p_value']:.3g}")
    for stage, r in summary.get("humaneval", {}).items():
        print(f"HumanEval {stage}: {r['passed']}/{r['n']} [{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LonghaulError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
