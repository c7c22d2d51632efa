"""Seconds per GRPO step on SmolLM2-135M-Instruct: longhaul vs TRL's GRPOTrainer, one run.

Same prompts, reward and settings as the anchor's TRL script, given as `--trl-script` (1 prompt x 8
completions of <= 128 tokens, temperature 1.0, beta 0.04 with the k3 KL, clip 0.2, lr 1e-6,
token-mean loss, groups with equal rewards still trained, as TRL does). longhaul runs in fp32
everywhere (TRL's maths and dtype) and, where the CPU has bf16 arithmetic
(`longhaul.hardware.native_bf16`), also in its bf16 mode (the paged engine in bf16 as the
sampler, bf16 autocast with fp32 master weights); elsewhere bf16 is emulated at a fraction of
fp32's speed and `auto` picks fp32, so that row is skipped. Both sample with longhaul's
engine, as `longhaul train` does. Each step's generation / reference / update seconds go to
the JSON too, with the step's floor on this host: the reference forward (2 x params x tokens
FLOPs) and the update (4 x: the backward; the forward is the rollout's, recorded) at the dense
fp32 GEMM rate measured here, and decoding at the measured memory bandwidth (every decode
step reads all weights once). No system doing the same maths on this host can beat it. TRL runs in the anchor environment
under `--anchors` (its `hf` venv and the model; built without vLLM is enough).

    python benchmarks/rl_step.py --trl-script PATH [--steps 4] [--anchors ~/.cache/longhaul-anchors] [--busy 1]

`--busy N` runs longhaul's rows once more beside N busy processes (`python -c "while True: pass"`):
the step time on a shared machine, and each row's slowdown against its own alone figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from longhaul.agent.single_turn import run_groups
from longhaul.malloc import foreign_env, keep_freed_memory, reexec_with_preload
from longhaul.config import AlgoConfig, TrainConfig
from longhaul.hardware import native_bf16
from longhaul.inference import RolloutParams, make_engine, sync_weights
from longhaul.inference.threads import SectionThreads
from longhaul.models import load_policy
from longhaul.rl.grpo import GRPOTrainer
from longhaul.types import Score

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contention import busy  # noqa: E402

HERE = Path(__file__).resolve().parent


class ToyFamily:
    """The anchor's reward: 1 if the completion defines `f`, else 0."""
    stop = ()

    @staticmethod
    def score_many(tasks, replies, **_):
        return [Score(float("def f" in r), "def f" in r, "pass" if "def f" in r else "fail") for r in replies]


class Task:
    def __init__(self, i):
        self.task_id, self.family, self.version = f"toy/{i}", "toy", "1"
        self.prompt = f"Write a Python function f(x) that returns x*{i}."


def host_rates() -> dict:
    """This host's dense fp32 GEMM rate (GFLOP/s, 2048^3) and memory read bandwidth (GB/s, a
    256 MB sum), each the best of 5 with every torch thread."""
    import torch

    a, b, x = torch.randn(2048, 2048), torch.randn(2048, 2048), torch.ones(64 << 20)
    def best(f):
        f()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return min(times)
    return {"gemm_gflops": 2 * 2048**3 / best(lambda: a @ b) / 1e9, "read_gbs": x.numel() * 4 / best(x.sum) / 1e9}


def step_floor(phase: dict, rates: dict, decode_steps: int) -> dict:
    """Seconds a step's phases need at least on this host (see the module docstring)."""
    params, tokens = phase["params"], phase["gen_tokens"] + phase["prompt_tokens"]  # the prompt is shared by the group (share_prompt)
    gemm = rates["gemm_gflops"] * 1e9
    return {"gen": decode_steps * params * 4 / (rates["read_gbs"] * 1e9), "ref": 2 * params * tokens / gemm,
            "update": 4 * params * tokens / gemm}


def ours(steps: int, fast: bool, phases: list[dict]) -> list[float]:
    model, tok = load_policy("smollm2-135m-instruct")
    algo = AlgoConfig(kl_coef=0.04, clip_low=0.2, clip_high=0.2, drop_zero_std_groups=False)
    train = TrainConfig(lr=1e-6, micro_batch=8, autocast="bfloat16" if fast else "none", share_prompt=True)
    trainer = GRPOTrainer(model, tok.pad_token_id, algo, train, temperature=1.0, max_new_tokens=128)
    sampler = make_engine(model, tok, "bfloat16" if fast else "float32")  # the rollout engine, as `longhaul train` uses
    reuse = trainer.reuse_rollout_forward(sampler)  # fp32: the rollout's forward is the training forward (same maths)
    params = RolloutParams(max_new_tokens=128, temperature=1.0)
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())  # tied embeddings once
    times, threads = [], SectionThreads()
    for step in range(steps):
        t0 = time.perf_counter()
        groups, gm = run_groups(sampler, tok, ToyFamily, [Task(step)], params, 8, seed=step, version=step)
        with threads:  # the update's threads from the neighbours' CPU use, as `longhaul train` sets them
            m = trainer.step(groups)
        sync_weights(sampler, model, version=step + 1)
        times.append(time.perf_counter() - t0)
        phases.append({"gen": gm["timing/gen"], "gen_tokens": gm["gen_tokens"], "prompt_tokens": len(groups[0][0].turns[0].prompt_ids),
                       "ref": m["timing/ref"], "update": m["timing/update_actor"],
                       "recorded_forward": reuse and getattr(trainer, "recorded_units", 0) == step + 1,
                       "params": n_params})
        print(f"longhaul ({'bf16' if fast else 'fp32'}) step {step + 1}: {times[-1]:.1f}s  "
              + " ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in phases[-1].items()), file=sys.stderr, flush=True)
    return times


def trl(steps: int, anchors: Path, script: Path) -> list[float]:
    py, model_dir = anchors / "hf" / "bin" / "python", anchors / "smollm2-135m-instruct"
    if not py.exists() or not (model_dir / "config.json").exists():
        raise SystemExit(f"anchor environment missing under {anchors}; build it (without vLLM) or pass --anchors")
    if not script.is_file():
        raise SystemExit(f"TRL script {script} is missing; pass the anchor's trl_grpo_bench.py as --trl-script")
    out = subprocess.run([str(py), str(script), str(model_dir), str(steps)], capture_output=True, text=True,
                         env=foreign_env())  # TRL with its own allocator, not the one this process preloaded
    times = [float(m.group(1)) for m in re.finditer(r"^step \d+ ([\d.]+)s", out.stdout, re.M)]
    if not times:
        raise SystemExit(f"TRL run printed no step times:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    print(f"TRL steps: {times}", file=sys.stderr)
    return times


def main():
    reexec_with_preload()  # the allocator the `longhaul` command and its workers use
    keep_freed_memory()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--trl-script", required=True, help="the anchor's TRL GRPO script (trl_grpo_bench.py)")
    ap.add_argument("--anchors", default=os.environ.get("ANCHORS", str(Path.home() / ".cache" / "longhaul-anchors")))
    ap.add_argument("--busy", type=int, default=0, help="also run longhaul's rows beside this many busy processes")
    ap.add_argument("--out", default=str(HERE / "results" / "rl_step.json"))
    args = ap.parse_args()
    phases = {"longhaul GRPO, fp32": []}
    runs = {"TRL GRPOTrainer 1.x, fp32 (anchor)": trl(args.steps, Path(args.anchors), Path(args.trl_script)),
            "longhaul GRPO, fp32": ours(args.steps, False, phases["longhaul GRPO, fp32"])}
    if native_bf16():
        phases["longhaul GRPO, bf16 engine + autocast"] = []
        runs["longhaul GRPO, bf16 engine + autocast"] = ours(args.steps, True, phases["longhaul GRPO, bf16 engine + autocast"])
    else:
        print("bf16 row skipped: this CPU has no bf16 arithmetic (auto picks fp32 here)", file=sys.stderr)
    if args.busy:
        for name in [k for k in runs if k.startswith("longhaul")]:
            key = f"{name}, beside {args.busy} busy"
            phases[key] = []
            with busy(args.busy):
                runs[key] = ours(args.steps, "bf16" in name, phases[key])
    # the first step pays one-off warm-up in both systems; report the median of the rest
    med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in runs.items()}
    anchor = med["TRL GRPOTrainer 1.x, fp32 (anchor)"]
    rates = host_rates()
    fp32 = phases["longhaul GRPO, fp32"]
    floors = [step_floor(ph, rates, decode_steps=128) for ph in fp32]
    floor = {k: statistics.median(f[k] for f in floors[1:] or floors) for k in ("gen", "ref", "update")}
    measured = {k: statistics.median(ph[k] for ph in fp32[1:] or fp32) for k in ("gen", "ref", "update")}
    med["floor: same maths at this host's peak"] = sum(floor.values())
    print(f"{'system':42s} {'s/step (median)':>16s} {'speed-up':>9s}")
    for k, v in med.items():
        print(f"{k:42s} {v:16.1f} {anchor / v:8.2f}x")
    for k, v in runs.items():
        if k.startswith("longhaul") and len(v) > 2:
            print(f"{k}: steps 2-{len(v)} {' '.join(f'{t:.1f}' for t in v[1:])} s (max/min {max(v[1:]) / min(v[1:]):.2f})")
        if ", beside " in k:
            alone = med[k.split(", beside ")[0]]
            print(f"{k}: {med[k] / alone:.2f}x the step time alone")
    print(f"host: fp32 GEMM {rates['gemm_gflops']:.0f} GFLOP/s, memory read {rates['read_gbs']:.1f} GB/s")
    print(f"{'phase':8s} {'longhaul s':>11s} {'floor s':>8s} {'of floor':>9s}")
    for k in floor:
        print(f"{k:8s} {measured[k]:11.1f} {floor[k]:8.1f} {floor[k] / measured[k]:8.0%}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"steps": args.steps, "seconds_per_step": runs, "phases": phases, "median_after_first": med,
                               "speedup_vs_trl": {k: anchor / v for k, v in med.items()},
                               "floor": {"host": rates, "phases_s": floor, "longhaul_phases_s": measured}}, indent=2))
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
