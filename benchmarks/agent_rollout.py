"""Multi-turn rollout wall clock: continuous episodes vs turn-synchronous rounds.

One RL step's rollout of the main job, side by side on this machine: `--prompts` train tasks
split over the families, `--group` episodes each, sampled at `--temperature` through the engine
in the same process, with the same seeds. `rounds`: every live episode replies, then every env
steps, one family after the other. `continuous`: every episode asks for its next reply as soon
as its env has stepped, families side by side in one engine. Both sample the same tokens
(seeded by episode and turn; the engine's outputs do not depend on the batch), so the table
compares the same work. Each schedule runs `--repeats` times, alternating; the median counts.

    python benchmarks/agent_rollout.py --model runs/agent/sft/model [--repeats 2]
        [--out benchmarks/results/agent_rollout.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from longhaul.agent.rollout import rollout_groups
from longhaul.envs.registry import get_family
from longhaul.inference import RolloutParams, make_engine
from longhaul.models import load_policy

sys.path.insert(0, str(Path(__file__).parent))
from common import host  # noqa: E402


def one_run(engine, tok, work, group: int, params: RolloutParams, schedule: str, max_turns: int) -> dict:
    engine.flush_prefix_cache()
    agent = {"context": "elide", "max_idle_turns": 3, "require_submit": True, "schedule": schedule}

    def family_run(item):
        k, (fam, tasks) = item
        return rollout_groups(engine, tok, fam, tasks, group, params, seed=1000 + k, max_turns=max_turns, agent=agent)

    t0 = time.perf_counter()
    if schedule == "continuous":
        with ThreadPoolExecutor(len(work)) as pool:
            results = list(pool.map(family_run, enumerate(work)))
    else:
        results = [family_run(item) for item in enumerate(work)]
    wall = time.perf_counter() - t0
    trajs = [t for groups, _ in results for g in groups for t in g]
    return {"seconds": wall, "episodes": len(trajs), "turns": sum(len(t.turns) for t in trajs),
            "gen_tokens": sum(t.completion_len for t in trajs), "passed": sum(t.info["passed"] for t in trajs),
            "tokens": [[list(turn.completion_ids) for turn in t.turns] for t in trajs]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a built-in name or a checkpoint directory")
    ap.add_argument("--families", default="multistep,terminal")
    ap.add_argument("--prompts", type=int, default=8, help="tasks per step, split over the families")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/agent_rollout.json"))
    a = ap.parse_args(argv)

    model, tok = load_policy(a.model)
    engine = make_engine(model, tok, dtype="float32")
    names = [n for n in a.families.split(",") if n]
    work = []
    for i, name in enumerate(names):
        fam = get_family(name)
        n = a.prompts // len(names) + (i < a.prompts % len(names))
        work.append((fam, fam.make_split("train", n)))
    params = RolloutParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature)
    runs: dict[str, list[dict]] = {"rounds": [], "continuous": []}
    for r in range(a.repeats):
        for schedule in runs:
            res = one_run(engine, tok, work, a.group, params, schedule, a.max_turns)
            runs[schedule].append(res)
            print(f"repeat {r + 1}/{a.repeats} {schedule:10s} {res['seconds']:7.1f} s  {res['turns']} turns  "
                  f"{res['gen_tokens']} tokens  {res['passed']}/{res['episodes']} passed", flush=True)
    same = all(x["tokens"] == runs["rounds"][0]["tokens"] for rs in runs.values() for x in rs)
    rows = {}
    for schedule, rs in runs.items():
        sec = statistics.median(x["seconds"] for x in rs)
        rows[schedule] = {"seconds": sec, "seconds_all": [x["seconds"] for x in rs], "episodes": rs[0]["episodes"],
                          "turns": rs[0]["turns"], "gen_tokens": rs[0]["gen_tokens"], "passed": rs[0]["passed"],
                          "gen_tokens_per_s": rs[0]["gen_tokens"] / sec}
    speedup = rows["rounds"]["seconds"] / rows["continuous"]["seconds"]
    print(f"\n{'schedule':12s}{'seconds':>10s}{'tokens/s':>10s}{'turns':>8s}{'passed':>8s}")
    for schedule, row in rows.items():
        print(f"{schedule:12s}{row['seconds']:10.1f}{row['gen_tokens_per_s']:10.1f}{row['turns']:8d}"
              f"{row['passed']:5d}/{row['episodes']}")
    print(f"continuous is {speedup:.2f}x rounds; same tokens in every run: {same}")
    result = {"host": host(), "model": a.model, "families": names, "prompts": a.prompts, "group": a.group,
              "temperature": a.temperature, "max_new_tokens": a.max_new_tokens, "max_turns": a.max_turns,
              "repeats": a.repeats, "schedules": rows, "speedup_continuous_over_rounds": speedup, "same_tokens": same}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
