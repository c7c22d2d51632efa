"""GRPO with vLLM generating the rollouts against the same job on longhaul's engine, on this
machine, in one run: does a run learn alike whichever engine samples for it, and how fast is each?

The job: `funcgen` with SmolLM2-135M-Instruct, STEPS steps of PROMPTS prompts x GROUP samples
(<= 128 tokens, T = 0.7, the quickstart's lr and KL), fp32 on both engines, same seed, then the
greedy held-out pass rate before and after on EVAL tasks (each run evaluates with its own
engine). vLLM runs from its own environment (`make vllm`; `$LONGHAUL_VLLM_PYTHON`) and gets the
new weights in place after every step. Sampling at T = 0.7 draws from each engine's own random
streams, so the two runs see different samples from the first step on: "alike" is judged on the
reward curve and the held-out result, not token for token (greedy tokens are equal: the tests).

Writes benchmarks/results/vllm_rollouts.{json,html} (the reward curves side by side).

    longhaul envcheck funcgen --n 200   # once: RL refuses families without a current manifest
    LONGHAUL_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/vllm_rollouts.py [--steps 16] [--prompts 4] [--group 4] [--eval 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import host, write_json

HERE = Path(__file__).resolve().parent

OUT = HERE / "results" / "vllm_rollouts.json"
ENGINES = ("engine", "vllm")


def run(args, out_dir: Path, sampler: str) -> dict:
    from longhaul.config import load_config
    from longhaul.runtime.metrics import read_metrics
    from longhaul.runtime.online import run_training

    name = f"grpo_{sampler}"
    cfg = load_config(None, [f"output_dir={out_dir}", f"name={name}", "model.name=smollm2-135m-instruct", "task.family=funcgen",
                             f"train.steps={args.steps}", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
                             "rollout.max_new_tokens=128", "rollout.temperature=0.7", "rollout.dtype=float32", "train.autocast=none",
                             f"rollout.sampler={sampler}", "train.lr=2e-5", "algo.kl_coef=0.02", f"train.micro_batch={args.group}",
                             "train.save_every=0", "log.progress=false", "log.tensorboard=false", "seed=0",
                             f"eval.n_tasks={args.eval}", "eval.max_new_tokens=128", "eval.before_after=true"])
    print(f"{name}: {args.steps} steps of {args.prompts} x {args.group}", flush=True)
    t0 = time.perf_counter()
    res = run_training(cfg)
    rows = read_metrics(out_dir / name)
    comp = res["comparison"]
    out = {"sampler": sampler, "run_wall_s": time.perf_counter() - t0, "train_wall_s": res["train_wall_s"],
           "gen_s": sum(r["timing/gen"] for r in rows), "reward": [r["reward"] for r in rows],
           "mean_reward": statistics.fmean(r["reward"] for r in rows),
           "last_half_reward": statistics.fmean(r["reward"] for r in rows[len(rows) // 2:]),
           "base": comp["base"], "trained": comp["trained"], "mcnemar_p": comp["mcnemar"]["p_value"]}
    print(f"{name}: {out['train_wall_s']:.0f} s training ({out['gen_s']:.0f} s generating), reward {out['mean_reward']:.3f}, "
          f"held-out {comp['base']['passed']} -> {comp['trained']['passed']} of {comp['base']['n']}", flush=True)
    return out


def table(r: dict) -> str:
    lines = ["| rollout engine | training s | generating s | mean reward | last half | held-out base | after | McNemar p |",
             "|---|---|---|---|---|---|---|---|"]
    for x in r["runs"]:
        lines.append(f"| {x['sampler']} | {x['train_wall_s']:.0f} | {x['gen_s']:.0f} | {x['mean_reward']:.3f} | "
                     f"{x['last_half_reward']:.3f} | {x['base']['passed']}/{x['base']['n']} | {x['trained']['passed']}/{x['trained']['n']} | "
                     f"{x['mcnemar_p']:.3g} |")
    return "\n".join(lines)


def write_plot(r: dict, path: Path) -> Path:
    from longhaul.eval.svg import line_chart

    series = {x["sampler"]: (list(range(1, len(x["reward"]) + 1)), x["reward"]) for x in r["runs"]}
    chart = line_chart(series, "GRPO on funcgen: mean reward a step", "step", "reward", w=560, h=280)
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>vLLM rollouts</title></head><body style='font-family:sans-serif'>"
            f"<h1>longhaul: GRPO with vLLM rollouts and with longhaul's engine</h1><p>{r['host']}, {r['date']}</p>{chart}</body></html>")
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page)
    os.replace(tmp, path)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--eval", type=int, default=100)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    if not os.environ.get("LONGHAUL_VLLM_PYTHON"):
        raise SystemExit("set LONGHAUL_VLLM_PYTHON to the python of a vLLM environment (`make vllm`: .venv-vllm/bin/python)")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run(args, Path(tmp), s) for s in ENGINES]
    r = {"host": host(), "date": time.strftime("%Y-%m-%d %H:%M"), "steps": args.steps, "prompts": args.prompts, "group": args.group,
         "eval_tasks": args.eval, "runs": runs}
    print(table(r))
    write_json(r, args.out)
    print(f"wrote {args.out} and {write_plot(r, args.out.with_suffix('.html'))}")


if __name__ == "__main__":
    main()
