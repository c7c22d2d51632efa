"""Sync vs async GRPO on SmolLM2-135M-Instruct over a fixed number of trajectories, on this
machine, in one run; then the discrete-event model of the runtime, calibrated on these runs,
checked against them, and asked what it predicts at 8-512 rollout workers and 1-64 trainers.

The job: `funcgen` (write a Python function, hidden tests decide), STEPS steps of PROMPTS
prompts x GROUP samples (<= 128 tokens, T = 0.7, the quickstart's lr and KL), held-out greedy
pass rate of the trained policy on EVAL tasks. The runs: runtime.mode=sync, then async with
each max_staleness of --staleness (rollouts in a child process, weights over shared memory),
once for each runtime.inflight_kv of --inflight-kv (what sequences in flight do at a weight
update: `keep` decodes on over their K/V, named -keep; `recompute` prefills them again). The
default is 24 steps: an async run spends its first step filling the pipeline (the trainer waits
while the worker generates the first s + 1 steps' requests in one batch), a fixed cost that a
short job exaggerates. Reported:
wall clock of the training loop, trajectories a second, the ratio to sync (overall and after
the first step), the wall clock of the whole run (model, engines, evaluations, loop), the mean
training reward and the held-out pass rate. The rollout process starts before the base
evaluation and loads the model while it runs, as sync's engine is built before its loop; what
of its start-up the evaluation does not cover falls inside the loop and is counted there.

Calibration for the model (`longhaul.runtime.sim`): generation, training, scoring and sync
costs come from the sync run's own metrics; the processor-sharing rates (how fast generation
and training go while the other runs on the same cores) from a separate 60-second probe that
runs both at once in two processes. The model then predicts the measured runs (its
error is in the table) and the scale-out grid, written with a plot to
benchmarks/results/async_vs_sync.{json,html}.

    python benchmarks/async_vs_sync.py [--steps 24] [--prompts 4] [--group 4] [--eval 100] [--staleness 1,2,3] [--inflight-kv keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"


def job_overrides(args, out_dir: Path, name: str) -> list[str]:
    return [f"output_dir={out_dir}", f"name={name}", "model.name=smollm2-135m-instruct", "task.family=funcgen",
            f"train.steps={args.steps}", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
            "rollout.max_new_tokens=128", "rollout.temperature=0.7", "train.lr=2e-5", "algo.kl_coef=0.02",
            f"train.micro_batch={args.group}", "train.save_every=0", "log.progress=false", "log.tensorboard=false",
            f"eval.n_tasks={max(1, args.eval)}", "eval.max_new_tokens=128", f"eval.before_after={'true' if args.eval else 'false'}"]


def run_one(args, out_dir: Path, name: str, extra: list[str]) -> dict:
    from longhaul.config import load_config
    from longhaul.runtime.metrics import read_metrics
    from longhaul.runtime.online import run_training

    cfg = load_config(None, job_overrides(args, out_dir, name) + extra)
    log(f"{name}: {' '.join(extra) or 'runtime.mode=sync'}")
    t0 = time.perf_counter()
    res = run_training(cfg)
    run_wall = time.perf_counter() - t0  # everything: model, engines and workers, evaluations, the loop
    rows = read_metrics(out_dir / name)
    lengths = [len(turn["completion_ids"]) for line in (out_dir / name / "buffer.jsonl").read_text().splitlines()
               if (r := json.loads(line))["op"] == "put" for t in r["group"] for turn in t["turns"]]
    trained = res.get("comparison", {}).get("trained") if res.get("comparison") else None
    out = {"name": name, "overrides": extra, "train_wall_s": res["train_wall_s"], "run_wall_s": run_wall,
           "workers_head_start_s": res["workers_head_start_s"],
           "trajectories": args.steps * args.prompts * args.group,
           "mean_reward": statistics.fmean(r["reward"] for r in rows),
           "last_half_reward": statistics.fmean(r["reward"] for r in rows[len(rows) // 2:]),
           "heldout_pass_rate": trained["pass_rate"] if trained else None,
           "heldout_ci95": trained["ci95"] if trained else None,
           "staleness_mean": statistics.fmean(r.get("staleness/mean", 0.0) for r in rows),
           "trainer_idle_ratio": rows[-1].get("trainer/idle_ratio"), "rows": rows, "lengths": lengths}
    out["trajectories_per_s"] = out["trajectories"] / out["train_wall_s"]
    # after the first step: without worker start-up (a child process loading the model) and the pipeline's fill
    out["steady_trajectories_per_s"] = (len(rows) - 1) * args.prompts * args.group / sum(r["step_time"] for r in rows[1:])
    log(f"{name}: {out['train_wall_s']:.0f} s, {out['trajectories_per_s']:.3f} traj/s, reward {out['mean_reward']:.3f}")
    return out


def costs_from(sync: dict, sharing: dict, groups_per_step: int, worker_start_s: float = 0.0):
    """The model's inputs from the sync run: generation = a x longest + b x tokens per step
    (least squares over the steps), training and scoring per token / group, the sync time; a
    worker process's start-up as the async runs' pools timed it (spawn to ready)."""
    from longhaul.runtime.sim import Costs

    rows = sync["rows"]
    xs = [(r["completions/max_length"], r["gen_tokens"], r["timing/gen"]) for r in rows]
    a11, a12, a22 = sum(x * x for x, _, _ in xs), sum(x * t for x, t, _ in xs), sum(t * t for _, t, _ in xs)
    b1, b2 = sum(x * g for x, _, g in xs), sum(t * g for _, t, g in xs)
    det = a11 * a22 - a12 * a12
    fixed, per_tok = ((b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det) if det else (0.0, -1.0)
    gen_tokens = sum(t for _, t, _ in xs)
    if fixed < 0 or per_tok < 0:  # a degenerate fit: charge it all per token
        fixed, per_tok = 0.0, sum(g for _, _, g in xs) / gen_tokens
    return Costs(gen_fixed_s=fixed, gen_token_s=per_tok,
                 train_token_s=sum(r["timing/update_actor"] + r["timing/ref"] for r in rows) / gen_tokens,
                 score_s=sum(r["timing/score"] for r in rows) / (len(rows) * groups_per_step),
                 sync_s=statistics.fmean(r.get("weight_sync/seconds", 0.0) for r in rows),
                 lengths=sync["lengths"], shared_cpu=True, gen_shared=sharing["gen_shared"], train_shared=sharing["train_shared"],
                 worker_start_s=worker_start_s)


def _gen_loop(batch: int, threads: int, busy, go, idle, stop, q) -> None:
    """Child of the sharing probe: generate `batch` x 64 tokens over and over while `go` is set,
    on `threads` torch threads while `busy` (the trainer updates) and on every core otherwise,
    exactly as a runtime worker does."""
    import os

    import torch

    from longhaul.agent.single_turn import encode_prompt
    from longhaul.hardware import resolve_dtype
    from longhaul.inference import LLMEngine
    from longhaul.inference.sampling import SamplingParams

    engine = LLMEngine(model="smollm2-135m-instruct", dtype=resolve_dtype("auto"))
    cores = os.cpu_count() or 1
    engine.step_hook = lambda: torch.set_num_threads(threads if busy.value else cores)
    prompts = [encode_prompt(engine.tokenizer, f"Write a Python function number {i} that reverses a list.") for i in range(batch)]
    params = [SamplingParams(max_tokens=64, min_tokens=64, ignore_eos=True, temperature=1.0, seed=i) for i in range(batch)]
    q.put(("ready", 0, 0.0))
    while not stop.is_set():
        if not go.wait(0.1):
            idle.set()
            continue
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params)
        q.put(("gen", sum(len(o.token_ids) for o in outs), time.perf_counter() - t0))


def measure_sharing(batch: int, seconds: float, worker_threads: int, trainer_threads: int) -> dict:
    """Generation (a child process with `worker_threads`, as the async worker) and training (this
    process, one GRPO step on fixed groups, over and over, on every core alone and on
    `trainer_threads` beside the worker, as the controller does): tokens a second of each alone,
    then both at once. gen_shared / train_shared are the at-once rates over the alone rates."""
    import torch
    import torch.multiprocessing as mp

    from longhaul.config import AlgoConfig, TrainConfig
    from longhaul.hardware import resolve_autocast
    from longhaul.models import load_policy
    from longhaul.rl.grpo import GRPOTrainer

    ctx = mp.get_context("spawn")
    go, idle, stop, q, busy = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Value("b", 0)
    child = ctx.Process(target=_gen_loop, args=(batch, worker_threads, busy, go, idle, stop, q), daemon=True)
    child.start()
    assert q.get(timeout=600)[0] == "ready"
    policy, tok = load_policy("smollm2-135m-instruct")
    trainer = GRPOTrainer(policy, tok.pad_token_id, AlgoConfig(kl_coef=0.02, drop_zero_std_groups=False),
                          TrainConfig(lr=1e-7, micro_batch=8, autocast=resolve_autocast("auto")), 0.7, 64)
    g = fixed_groups(tok, batch)
    n_train = sum(len(t.turns[0].completion_ids) for grp in g for t in grp)

    def train_while(done) -> float:
        """Train steps until `done()`; tokens a second."""
        n, t0 = 0, time.perf_counter()
        while not done() or n == 0:
            trainer.step(g)
            n += n_train
        return n / (time.perf_counter() - t0)

    def gen_rounds(k: int) -> list:
        return [q.get(timeout=600) for _ in range(k)]

    rate = lambda items: sum(n for _, n, _ in items) / sum(dt for _, _, dt in items)
    third = seconds / 3
    go.set()
    t0 = time.perf_counter()
    alone = gen_rounds(2)
    while time.perf_counter() - t0 < third:
        alone += gen_rounds(1)
    idle.clear()
    go.clear()
    idle.wait(600)  # the round in flight has ended
    while not q.empty():
        alone.append(q.get())
    gen_alone = rate(alone)
    t0 = time.perf_counter()
    train_alone = train_while(lambda: time.perf_counter() - t0 >= third)
    full = torch.get_num_threads()
    torch.set_num_threads(trainer_threads)
    busy.value = 1
    go.set()
    both, t0 = [], time.perf_counter()

    def enough() -> bool:
        while not q.empty():
            both.append(q.get())
        return len(both) >= 2 and time.perf_counter() - t0 >= third

    train_both = train_while(enough)
    go.clear()
    busy.value = 0
    torch.set_num_threads(full)
    gen_both = rate(both)  # rounds that finished while training ran
    stop.set()
    child.join(timeout=120)
    out = {"gen_tok_s_alone": gen_alone, "gen_tok_s_shared": gen_both, "train_tok_s_alone": train_alone,
           "train_tok_s_shared": train_both, "gen_shared": gen_both / gen_alone, "train_shared": train_both / train_alone}
    log("sharing: " + ", ".join(f"{k} {v:.3g}" for k, v in out.items()))
    return out


def fixed_groups(tok, batch: int, group: int = 8) -> list:
    """Fixed training groups: real prompts, 64 random completion tokens each, alternating rewards."""
    import torch

    from longhaul.agent.single_turn import encode_prompt
    from longhaul.types import Trajectory, Turn

    gen = torch.Generator().manual_seed(0)
    groups = []
    for gi in range(max(1, batch // group)):
        prompt = encode_prompt(tok, f"Write a Python function f{gi}(x) that returns x*{gi}.")
        grp = []
        for k in range(group):
            ids = torch.randint(100, 40000, (64,), generator=gen).tolist()
            grp.append(Trajectory([Turn(prompt, ids, [-1.0] * 64, [0] * 64, [1] * 64)], float(k % 2), gi, {}))
        groups.append(grp)
    return groups


def log(msg: str) -> None:
    print(f"[async_vs_sync {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--eval", type=int, default=100, help="held-out tasks evaluated after training (0: none)")
    ap.add_argument("--staleness", default="1,2,3")
    ap.add_argument("--inflight-kv", default="keep", help="runtime.inflight_kv values: each async run with each")
    ap.add_argument("--worker-threads", type=int, default=None, help="torch threads of the async rollout process (default: runtime.worker_threads's)")
    ap.add_argument("--probe-seconds", type=float, default=60.0)
    ap.add_argument("--out", default=str(OUT / "async_vs_sync.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="async-vs-sync-"))
    runs = [run_one(args, work, "sync", [])]
    for kv in args.inflight_kv.split(","):
        for s in [int(x) for x in args.staleness.split(",")]:
            extra = ["runtime.mode=async", f"runtime.max_staleness={s}", "runtime.worker_kind=process", f"runtime.inflight_kv={kv}"]
            if args.worker_threads:
                extra.append(f"runtime.worker_threads={args.worker_threads}")
            runs.append({**run_one(args, work, f"async{s}" + ("-keep" if kv == "keep" else ""), extra), "staleness": s})
    log("probing processor sharing (generation and training at once)")
    from longhaul.config import load_config
    from longhaul.runtime.local import trainer_threads, worker_threads

    cfg = load_config(None, job_overrides(args, work, "probe") + runs[-1]["overrides"])
    sharing = measure_sharing(args.prompts * args.group, args.probe_seconds, worker_threads(cfg), trainer_threads(cfg))
    report(args, runs, sharing)


def report(args, runs: list[dict], sharing: dict) -> None:
    from longhaul.runtime.sim import Workload, simulate, sweep

    # the part of a worker's start-up that falls inside the loop (the rest overlapped the base evaluation)
    starts = [max(0.0, r["rows"][-1]["rollout/worker_start_s"] - r["workers_head_start_s"]) for r in runs[1:]
              if r["rows"][-1].get("rollout/worker_start_s")]
    costs = costs_from(runs[0], sharing, args.prompts, statistics.fmean(starts) if starts else 0.0)
    base = runs[0]["trajectories_per_s"]
    steady = runs[0]["steady_trajectories_per_s"]
    print(f"{'run':10s} {'wall s':>8s} {'traj/s':>8s} {'vs sync':>8s} {'steps 2+':>9s} {'whole run s':>12s} {'reward':>8s} {'held-out':>9s} "
          f"{'stale':>6s} {'model s':>8s} {'model err':>9s}")
    for r in runs:
        s = r.get("staleness", 0)
        wl = Workload(args.steps, args.prompts, args.group, "sync" if s == 0 else "async", s, remote_workers=s > 0)  # sync: inline
        pred = simulate(costs, wl).wall_s
        r["model_wall_s"], r["model_error"] = pred, pred / r["train_wall_s"] - 1
        held = "-" if r["heldout_pass_rate"] is None else f"{100 * r['heldout_pass_rate']:.1f}%"
        print(f"{r['name']:10s} {r['train_wall_s']:8.0f} {r['trajectories_per_s']:8.3f} {r['trajectories_per_s'] / base:7.2f}x "
              f"{r['steady_trajectories_per_s'] / steady:8.2f}x {r['run_wall_s']:12.0f} "
              f"{r['mean_reward']:8.3f} {held:>9s} {r['staleness_mean']:6.2f} {pred:8.0f} {100 * r['model_error']:+8.1f}%")
    from dataclasses import replace

    scale = replace(costs, shared_cpu=False)  # every worker and trainer on its own machine
    grid = sweep(scale, steps=20, groups=512, group_size=args.group, workers=[8, 32, 128, 512], trainers=[1, 4, 16, 64],
                 staleness=[1, 2])
    print("\nmodel at scale (512 groups a step; each worker / trainer a machine like this one):")
    print(f"{'workers':>8s} {'trainers':>8s} {'sync traj/s':>12s} {'async1':>8s} {'async2':>8s}")
    for g in grid:
        print(f"{g['workers']:8d} {g['trainers']:8d} {g['sync_trajectories_per_s']:12.2f} {g['async1_speedup']:7.2f}x {g['async2_speedup']:7.2f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"args": vars(args), "sharing": sharing, "costs": {k: v for k, v in costs.__dict__.items() if k != "lengths"},
               "runs": [{k: v for k, v in r.items() if k not in ("rows", "lengths")} for r in runs], "scale": grid}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, out)
    log(f"wrote {out} and {write_plot(grid, runs, out.with_suffix('.html'))}")


def write_plot(grid: list[dict], runs: list[dict], path: Path) -> Path:
    from longhaul.eval.svg import bar_chart, line_chart

    measured = bar_chart([r["name"] for r in runs], {"measured": [r["train_wall_s"] for r in runs],
                                                     "model": [r["model_wall_s"] for r in runs]},
                         "2 cores: training wall clock, measured vs model (s)", "seconds")
    charts = [measured]
    for k in (1, 2):
        series = {f"{t} trainer{'s' if t > 1 else ''}": ([g["workers"] for g in grid if g["trainers"] == t],
                                                         [g[f"async{k}_speedup"] for g in grid if g["trainers"] == t])
                  for t in sorted({g["trainers"] for g in grid})}
        charts.append(line_chart(series, f"model: async (staleness {k}) / sync throughput", "rollout workers", "speed-up", y_min=0.8))
    series = {f"{t} trainers": ([g["workers"] for g in grid if g["trainers"] == t], [g["sync_trajectories_per_s"] for g in grid if g["trainers"] == t])
              for t in sorted({g["trainers"] for g in grid})}
    charts.append(line_chart(series, "model: sync trajectories / s", "rollout workers", "trajectories/s"))
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>async vs sync</title></head><body style='font-family:sans-serif'>"
            "<h1>longhaul: async vs sync RL runtime</h1><div style='display:flex;flex-wrap:wrap;gap:12px'>" + "".join(charts) + "</div></body></html>")
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page)
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    main()
