"""scene3d verification throughput: one warm browser reused vs a fresh browser per check.

`--n` tasks of difficulty `--difficulty`, the sub-families taken in turn, each solved by its
reference actions (so every check really runs on a built scene, and all should pass), are exported
once and verified one after another (`verify.verify_project`, the checks and `no_errors`):
(a) through one `BrowserPool` whose browser is started before the clock runs and reused;
(b) through a fresh `BrowserPool` per task: launch + check (its first job) + drop.
Browser start-up is the median, over tasks, of (b)'s first job minus (a)'s time on the same task.
Export is timed apart (it is the same in both). One process, one check at a time: no parallelism.

    python benchmarks/scene3d_verify.py [--n 40] [--difficulty 2] [--out benchmarks/results/scene3d_verify.json]

Prints a table and writes the JSON atomically.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from longhaul.cpus import available_cpus
from longhaul.envs.scene3d import SUBFAMILIES, VERSION, make_task
from longhaul.envs.scene3d.browser import BrowserPool, chromium_path
from longhaul.envs.scene3d.export import export_project
from longhaul.envs.scene3d.render import solved_world
from longhaul.envs.scene3d.verify import verify_project
from longhaul.runtime.progress import progress_bar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, pct, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "scene3d_verify.json"


def prepare(n: int, difficulty: int, root: Path) -> list[dict]:
    """n solved tasks, sub-families in turn, each exported to its own project folder."""
    subs = sorted(SUBFAMILIES)
    jobs = []
    for i in range(n):
        task = make_task(i // len(subs), difficulty, subs[i % len(subs)])
        t = time.perf_counter()
        project = export_project(solved_world(task), root / f"t{i:03d}")
        jobs.append({"task": task, "project": project, "export_s": time.perf_counter() - t})
    return jobs


def run_mode(name: str, jobs: list[dict], timeout_s: float, fresh: bool) -> dict:
    """Verify every job in turn; per task: seconds (and, when fresh, the first job's and the drop's)."""
    warm = None if fresh else BrowserPool()
    version = None
    if warm is not None:
        t = time.perf_counter()
        version = warm.run(lambda ctx: ctx.browser.version, jobs[0]["project"], timeout_s)  # launch before the clock runs
        start_s = time.perf_counter() - t
    per_task, first_job, drops, passed, checks = [], [], [], 0, 0
    wall = time.perf_counter()
    try:
        with progress_bar(True, stderr=True) as prog:
            bar = prog.add_task(f"{name:5s}", total=len(jobs), info="")
            for k, job in enumerate(jobs):
                pool = warm or BrowserPool()
                t = time.perf_counter()
                report = verify_project(job["project"], list(job["task"].checks), timeout_s, pool)
                t_check = time.perf_counter()
                if fresh:
                    pool.drop()
                    first_job.append(t_check - t)
                    drops.append(time.perf_counter() - t_check)
                per_task.append(time.perf_counter() - t)
                passed += report.passed
                checks += len(report.results)
                if not report.passed:
                    job.setdefault("failures", {})[name] = [f"{r.check}: {r.reason}" for r in report.results if not r.passed][:3]
                rate = (k + 1) / (time.perf_counter() - wall)
                prog.update(bar, advance=1, info=f"{rate:.2f} tasks/s, {passed}/{k + 1} passed")
    finally:
        if warm is not None:
            warm.drop()
    wall = time.perf_counter() - wall
    out = {"tasks": len(jobs), "checks": checks, "passed": passed, "seconds": wall, "tasks_per_s": len(jobs) / wall,
           "checks_per_s": checks / wall, "task_p50_s": statistics.median(per_task), "task_p90_s": pct(per_task, 0.9),
           "per_task_s": per_task}
    if fresh:
        out |= {"first_job_s": first_job, "drop_p50_s": statistics.median(drops)}
    else:
        out |= {"browser": version, "warm_up_s": start_s}
    return out


def run(n: int, difficulty: int, timeout_s: float) -> dict:
    chromium_path()  # a missing browser fails now, with its fix, not inside the first job
    with tempfile.TemporaryDirectory(prefix="scene3d-bench-") as tmp:
        jobs = prepare(n, difficulty, Path(tmp))
        pool = run_mode("pool", jobs, timeout_s, fresh=False)
        fresh = run_mode("fresh", jobs, timeout_s, fresh=True)
    startup = [f - p for f, p in zip(fresh["first_job_s"], pool["per_task_s"])]
    return {"family": f"scene3d/v{VERSION}", "difficulty": difficulty, "subfamilies": sorted({j["task"].subfamily for j in jobs}),
            "timeout_s": timeout_s, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "available_cpus": available_cpus(), "browser": pool["browser"]},
            "export_p50_s": statistics.median(j["export_s"] for j in jobs),
            "browser_startup_s": statistics.median(startup), "pool_vs_fresh": pool["tasks_per_s"] / fresh["tasks_per_s"],
            "modes": {"pool": pool, "fresh": fresh},
            "failures": {j["task"].task_id + f" ({j['task'].subfamily})": j["failures"] for j in jobs if "failures" in j}}


def table(r: dict) -> str:
    m = r["machine"]
    out = [(f"{r['family']} d{r['difficulty']}, {r['modes']['pool']['tasks']} oracle-solved tasks over {len(r['subfamilies'])} sub-families; "
            f"{m['cpu']}, {m['cpus']} CPUs ({m['available_cpus']} available); Chromium {m['browser']}"),
           f"{'mode':28s} {'tasks/s':>8s} {'checks/s':>9s} {'p50 s':>7s} {'p90 s':>7s} {'passed':>8s}"]
    for name, label in (("pool", "one warm BrowserPool"), ("fresh", "fresh BrowserPool per task")):
        x = r["modes"][name]
        out.append(f"{label:28s} {x['tasks_per_s']:8.2f} {x['checks_per_s']:9.1f} {x['task_p50_s']:7.2f} {x['task_p90_s']:7.2f} "
                   f"{x['passed']:>4d}/{x['tasks']}")
    out.append(f"pool/fresh {r['pool_vs_fresh']:.2f}x; browser start-up {r['browser_startup_s']:.2f} s (median first-job overhead), "
               f"drop {r['modes']['fresh']['drop_p50_s']:.2f} s, export {1000 * r['export_p50_s']:.0f} ms a task (p50, not in the rates)")
    for tid, why in r["failures"].items():
        out.append(f"  FAIL {tid}: {why}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="tasks")
    ap.add_argument("--difficulty", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a verification may take")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    result = run(a.n, a.difficulty, a.timeout)
    print(table(result))
    write_json(result, a.out)


if __name__ == "__main__":
    main()
