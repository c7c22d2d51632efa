"""The environment quality platform: validate every task of a family, version the result.

Each checked task is run `runs` times with its reference solution and with the null agent:
- valid: the reference passes every time and the null agent fails every time;
- flaky: any result differs between runs (listed and excluded);
- failing: the reference fails, or the null agent passes (listed and excluded);
- infra: the check itself broke (listed and excluded).
Answer families replay reference/null replies through their verifier; workspace families run
an oracle agent (the task's reference tool calls, then submit) and a null agent (submit at once)
through the real agent loop and sandbox. Episodes that exceed their time limit are failing.

Results go to a manifest (`$LONGHAUL_HOME/envcheck/manifest.json`, written atomically), one entry
per family with its version's content hash. Training refuses a family whose entry is missing,
stale (the code or data changed since) or failing, and skips the excluded tasks. This lives in
`eval` rather than `envs` because the oracle runs through the agent loop, which sits above envs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from longhaul.agent.loop import AgentConfig, ScriptedPolicy, run_episodes
from longhaul.envs.registry import Family, families, get_family
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError
from longhaul.home import cache_home
from longhaul.models.byte_tokenizer import byte_tokenizer

MIN_VALID_FRACTION = 0.95  # a family with fewer valid tasks than this is failing as a whole
EPISODE_LIMIT_S = 120.0  # one oracle or null episode, reset to verify


def manifest_path() -> Path:
    """`$LONGHAUL_ENVCHECK_MANIFEST`, else `$LONGHAUL_HOME/envcheck/manifest.json`."""
    forced = os.environ.get("LONGHAUL_ENVCHECK_MANIFEST")
    return Path(forced).expanduser() if forced else cache_home() / "envcheck" / "manifest.json"


def _digest(task) -> str:
    d = dataclasses.asdict(task) if dataclasses.is_dataclass(task) else dict(vars(task))
    for k in ("task_id", "seed", "difficulty"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def _subfamily(task, fam: Family) -> str:
    return f"{fam.name}/{getattr(task, 'subfamily', None) or fam.name}"


def tasks_for(fam: Family, n: int) -> list:
    """Up to `n` tasks per split, spread over the family's difficulties; all of a fixed benchmark."""
    return [t for _, t in drawn_tasks(fam, n)]


def drawn_tasks(fam: Family, n: int) -> list[tuple[str, object]]:
    """`tasks_for`'s tasks as (split, task) in order; a task two splits draw counts for the first."""
    per = 10**9 if fam.fixed_set else max(1, math.ceil(n / len(fam.difficulties)))
    out, seen = [], set()
    for split in fam.splits:
        for d in fam.difficulties:
            for t in fam.make_split(split, per, d, None):
                if t.task_id not in seen:
                    seen.add(t.task_id)
                    out.append((split, t))
    return out


def _answer_runs(fam: Family, tasks: list, runs: int, progress) -> tuple[dict, dict, dict]:
    ref, null, wall = {t.task_id: [] for t in tasks}, {t.task_id: [] for t in tasks}, {}
    for _ in range(runs):
        for chunk_start in range(0, len(tasks), 64):
            chunk = tasks[chunk_start:chunk_start + 64]
            t0 = time.perf_counter()
            scores = fam.score_many(chunk + chunk, [fam.reference_reply(t) for t in chunk] + [fam.null_reply(t) for t in chunk])
            per = (time.perf_counter() - t0) / (2 * len(chunk))
            for t, s_ref, s_null in zip(chunk, scores[:len(chunk)], scores[len(chunk):]):
                ref[t.task_id].append(s_ref.status)
                null[t.task_id].append(s_null.status)
                wall[t.task_id] = max(wall.get(t.task_id, 0.0), per)
            progress(len(chunk) / runs)
    return ref, null, wall


def _workspace_runs(fam: Family, tasks: list, runs: int, progress, workers: int) -> tuple[dict, dict, dict]:

    tok = byte_tokenizer()
    make_env = fam.make_env or (lambda task: WorkspaceEnv())
    ref, null, wall = {t.task_id: [] for t in tasks}, {t.task_id: [] for t in tasks}, {}
    longest = max(len(t.reference) for t in tasks) + 2
    cfg = AgentConfig(max_turns=longest, max_tokens=10_000_000, workers=workers)
    for r in range(runs):
        for chunk_start in range(0, len(tasks), 4 * workers):
            chunk = tasks[chunk_start:chunk_start + 4 * workers]
            eps = [t for t in chunk for _ in (0, 1)]
            keys = [f"{r}:{'oracle' if k % 2 == 0 else 'null'}:{t.task_id}" for k, t in enumerate(eps)]
            scripts = {}
            for k, t in zip(keys, eps):
                scripts[k] = ([a.text() for a in t.reference] if ":oracle:" in k else []) + [format_call("submit")]
            trajs = run_episodes(ScriptedPolicy(tok, scripts), tok, make_env, eps, cfg, keys=keys)
            for k, t, traj in zip(keys, eps, trajs):
                status = traj.info["status"]
                if traj.info.get("ended") == "infra_error":
                    status = "infra_error"
                elif traj.info.get("wall_s", 0.0) > EPISODE_LIMIT_S:
                    status = "slow"
                (ref if ":oracle:" in k else null)[t.task_id].append(status)
                wall[t.task_id] = max(wall.get(t.task_id, 0.0), traj.info.get("wall_s", 0.0))
            progress(len(chunk) / runs)
    return ref, null, wall


def check_family(fam: Family, tasks: list, runs: int = 2, workers: int = 4, progress: Callable[[float], None] = lambda k: None,
                 splits: dict[str, str] | None = None) -> dict:
    """Check `tasks` of one family (see `tasks_for`) `runs` times each; return its manifest entry.
    `splits` (task id -> split) groups the flaky and failing tasks by split in `problems`."""
    if fam.kind == "answer":
        if fam.reference_reply is None:
            raise LonghaulError(f"family {fam.name!r} has no reference_reply; envcheck cannot validate it")
        ref, null, wall = _answer_runs(fam, tasks, runs, progress)
    else:
        ref, null, wall = _workspace_runs(fam, tasks, runs, progress, workers)
    verdicts: dict[str, tuple[str, str]] = {}
    for t in tasks:
        r, z = ref[t.task_id], null[t.task_id]
        if "infra_error" in r + z:
            verdicts[t.task_id] = ("infra", "the check itself failed (infra error)")
        elif len(set(r)) > 1 or len(set(z)) > 1:
            verdicts[t.task_id] = ("flaky", f"reference {r}, null {z} across runs")
        elif r[0] != "pass":
            verdicts[t.task_id] = ("failing", f"the reference solution does not pass ({r[0]})")
        elif z[0] == "pass":
            verdicts[t.task_id] = ("failing", "the null agent passes")
        else:
            verdicts[t.task_id] = ("valid", "")
    valid_tasks = [t for t in tasks if verdicts[t.task_id][0] == "valid"]
    distinct = {_digest(t) for t in valid_tasks}
    subs = Counter(_subfamily(t, fam) for t in valid_tasks)
    frac = len(valid_tasks) / max(1, len(tasks))
    return {
        "family": fam.name, "version": fam.version, "content_hash": fam.content_hash(), "kind": fam.kind,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs,
        "checked": len(tasks), "valid": len(valid_tasks), "distinct_valid": len(distinct), "valid_fraction": frac,
        "subfamilies": dict(sorted(subs.items())),
        "flaky": sorted(tid for tid, (v, _) in verdicts.items() if v == "flaky"),
        "failing": sorted(tid for tid, (v, _) in verdicts.items() if v in ("failing", "infra")),
        "reasons": {tid: why for tid, (v, why) in sorted(verdicts.items()) if v != "valid"},
        "problems": _problems(tasks, verdicts, fam, splits or {}),
        "max_task_s": round(max(wall.values(), default=0.0), 3),
        "status": "ok" if tasks and frac >= MIN_VALID_FRACTION else "failing",
    }


def _problems(tasks: list, verdicts: dict, fam: Family, splits: dict[str, str]) -> dict:
    """Flaky and failing task ids by split, then sub-family: `{split: {subfamily: {"flaky": [...],
    "failing": [...]}}}`, only where there are some."""
    out: dict = {}
    for t in tasks:
        kind = {"flaky": "flaky", "failing": "failing", "infra": "failing"}.get(verdicts[t.task_id][0])
        if kind:
            sub = out.setdefault(splits.get(t.task_id, "unknown"), {}).setdefault(_subfamily(t, fam), {"flaky": [], "failing": []})
            sub[kind].append(t.task_id)
    return out


def load_manifest(path: Path | None = None) -> dict:
    p = path or manifest_path()
    if not p.exists():
        return {"families": {}}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise LonghaulError(f"envcheck manifest {p} is corrupt ({e.msg}); delete it and run `longhaul envcheck` again") from e


def save_manifest(data: dict, path: Path | None = None) -> Path:
    p = path or manifest_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, p)
    return p


def run_envcheck(names: list[str] | None, n: int, runs: int = 2, workers: int = 4, manifest: Path | None = None,
                 progress_factory=None) -> dict:
    """Check the named families (all built-ins by default), update the manifest, return the summary."""
    if n < 1:
        raise LonghaulError(f"--n must be >= 1, got {n}")
    if runs < 2:
        raise LonghaulError(f"envcheck needs at least 2 runs per task to detect flaky tasks, got --runs {runs}")
    fams = [get_family(x) for x in names] if names else list(families().values())
    data = load_manifest(manifest)
    entries = {}
    for fam in fams:
        drawn = drawn_tasks(fam, n)
        tasks, splits = [t for _, t in drawn], {t.task_id: split for split, t in drawn}
        if progress_factory:
            with progress_factory(fam.name, len(tasks)) as advance:
                entry = check_family(fam, tasks, runs, workers, advance, splits)
        else:
            entry = check_family(fam, tasks, runs, workers, splits=splits)
        entries[fam.name] = entry
        data["families"][fam.name] = entry
    path = save_manifest(data, manifest)
    return {
        "families": entries,
        "tasks": sum(e["checked"] for e in entries.values()),
        "valid": sum(e["distinct_valid"] for e in entries.values()),
        "subfamilies": sum(len(e["subfamilies"]) for e in entries.values()),
        "flaky": [tid for e in entries.values() for tid in e["flaky"]],
        "failing": [tid for e in entries.values() for tid in e["failing"]],
        "problems": {name: e["problems"] for name, e in entries.items() if e["problems"]},
        "status": "ok" if all(e["status"] == "ok" for e in entries.values()) else "failing",
        "manifest": str(path),
    }


def require_checked(fam: Family, manifest: Path | None = None) -> set[str]:
    """The task ids training must skip; raises when the family's manifest entry is missing,
    stale or failing."""
    entry = load_manifest(manifest)["families"].get(fam.name)
    fix = f"run `longhaul envcheck {fam.name}`"
    if entry is None:
        raise LonghaulError(f"task family {fam.name!r} has not been validated (no envcheck manifest entry); {fix}")
    if entry.get("version") != fam.version or entry.get("content_hash") != fam.content_hash():
        raise LonghaulError(f"the envcheck manifest of task family {fam.name!r} is stale (its code or data changed); {fix}")
    if entry.get("status") != "ok":
        raise LonghaulError(f"task family {fam.name!r} failed envcheck ({entry.get('valid')}/{entry.get('checked')} valid); "
                            f"fix the family, then {fix}")
    return set(entry.get("flaky", [])) | set(entry.get("failing", []))
