"""What the console says about a run: its summary (status, algorithm, model, progress), its
config, its metrics after a line, and its evaluation table.

Status is inferred from files, since no process registry exists: `finished` when the run's
report (`report.html`, and for a pipeline `pipeline.json`) is at least as new as its data,
`running` when any of its files changed in the last `LIVE_S` seconds, else `failed` (it stopped
without writing its report: an error, a kill, or an interrupted run that `--resume` would go on
with). Reads what `runtime` and `eval` write; writes nothing.
"""

from __future__ import annotations

import bisect
import json
import time
from pathlib import Path

from longhaul.console.episodes import episode_sources
from longhaul.console.jsonl import Derived, JsonlCache, parse_lines
from longhaul.console.paths import ConsoleError, RunsRoot, is_run, read_config

LIVE_S = 120.0  # a trainer writes a metrics line every step; steps of small runs take seconds to a minute
TAIL_LINES = 64  # how far back from the last metrics line to look for the latest reward and pass rate
METRICS_PAGE = 5000  # rows one metrics response carries at most (the page asks again while `more`)
COLUMN_FILES = 8  # metrics files whose columns stay parsed in memory (the runs opened last)
DATA_FILES = ("metrics.jsonl", "buffer.jsonl", "demos.jsonl", "config.yaml", "pipeline_config.json", "team_train_config.json")
AGENT_KEYS = ("submit_rate", "turns_to_submit", "invalid_calls", "loop_rate", "repair_rate")


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _newest(d: Path, depth: int = 1) -> float:
    """The newest mtime of the run's data files, its episode files, its checkpoints and (a
    pipeline's) its stages' data."""
    times = [_mtime(d / f) for f in DATA_FILES] + [_mtime(p) for p in d.glob("episodes_*.jsonl")] + [_mtime(d / "checkpoints")]
    if depth:
        times += [_newest(s, 0) for s in d.iterdir() if s.is_dir() and is_run(s)]
    return max(times)


class Runs:
    def __init__(self, root: RunsRoot):
        self.root = root
        self.cache = JsonlCache()
        self._columns = Derived(COLUMN_FILES)

    # ---- metrics ----------------------------------------------------------------------
    def metrics(self, name: str, after: int = 0, limit: int = METRICS_PAGE) -> dict:
        """Rows of metrics.jsonl after line `after` (1-based lines; 0 gives all), at most `limit`.
        `next` is the `after` of the following call; `reset` says the file was rewritten (a
        resumed run) and these rows start again from line 1."""
        d = self.root.run_dir(name)
        path = self.root.file(d, "metrics.jsonl")
        if path is None:
            return {"rows": [], "next": 0, "more": False, "reset": after > 0, "warnings": []}
        f = self.cache.get(path)
        with f.lock:
            reset = f.refresh()
            if reset or after > len(f):  # rewritten: these rows start again from line 1
                reset, after = True, 0
            stop = min(len(f), after + max(1, limit))
            rows, warnings = parse_lines(f.lines(after, stop), after, "metrics.jsonl")
            total = len(f)
        return {"rows": [dict(r, _line=n) for n, r in rows], "next": stop, "more": stop < total, "reset": reset,
                "warnings": warnings}

    def metric_columns(self, name: str, after: int = 0, limit: int = METRICS_PAGE) -> dict:
        """What `metrics` returns, as columns: `x` (each line's step, else its line number) and
        `columns`, each top-level number (or missing value) of those lines under its key, None
        where a line lacks it. Each line is parsed once: the columns of the last `COLUMN_FILES`
        files read stay in memory and grow with the file, so a reload of a 10,000-step run only
        slices and serialises them."""
        d = self.root.run_dir(name)
        path = self.root.file(d, "metrics.jsonl")
        if path is None:
            return {"x": [], "columns": {}, "next": 0, "more": False, "reset": after > 0, "warnings": []}
        f = self.cache.get(path)
        with f.lock:
            reset = f.refresh()
            cols, stale = self._columns.get(f, _Columns)
            reset = reset or (stale and after > 0)  # rewritten since the columns were read: whoever reads on starts over
            if reset or after > len(f):
                reset, after = True, 0
            if cols.lines_read < len(f):
                rows, warnings = parse_lines(f.lines(cols.lines_read, len(f)), cols.lines_read, "metrics.jsonl", numbered=True)
                cols.extend(rows, warnings, len(f))
            stop = min(len(f), after + max(1, limit))
            total = len(f)
            return {**cols.between(after, stop), "next": stop, "more": stop < total, "reset": reset}

    def _latest(self, d: Path) -> dict:
        """The last step, and the latest reward and pass rate, from the tail of metrics.jsonl."""
        path = self.root.file(d, "metrics.jsonl")
        out = {"last_step": None, "reward": None, "pass_rate": None}
        if path is None:
            return out
        f = self.cache.get(path)
        with f.lock:
            f.refresh()
            rows, _ = parse_lines(f.lines(max(0, len(f) - TAIL_LINES), len(f)), 0, "metrics.jsonl")
        for _, r in reversed(rows):
            for key, field in (("step", "last_step"), ("reward", "reward"), ("pass_rate", "pass_rate")):
                if out[field] is None and isinstance(r.get(key), (int, float)):
                    out[field] = r[key]
        return out

    # ---- summary ----------------------------------------------------------------------
    def summary(self, name: str, now: float | None = None) -> dict:
        d = self.root.run_dir(name)
        now = time.time() if now is None else now
        cfg_file, cfg = read_config(d)
        pipeline = (d / "pipeline_config.json").is_file() or (d / "pipeline.json").is_file()
        team = cfg_file == "team_train_config.json"
        kind = "pipeline" if pipeline else "team" if team else (cfg.get("algo") or {}).get("name")
        out = {"name": name, "algorithm": kind,
               "model": (cfg.get("model") or {}).get("name"), "started": _mtime(d / cfg_file) if cfg_file else None,
               **self._latest(d)}
        newest = _newest(d)
        done = _mtime(d / "report.html") if not pipeline or (d / "pipeline.json").is_file() else 0.0
        if done and done >= newest - 1.0:  # the report is written last; 1 s of slack for coarse mtimes
            out["status"] = "finished"
        else:
            out["status"] = "running" if now - newest < LIVE_S else "failed"
        out["updated"] = newest
        if pipeline and (d / "pipeline.json").is_file():
            stages = _load_json(d / "pipeline.json").get("stages") or {}
            if stages:
                out["pass_rate"] = list(stages.values())[-1].get("pass_rate")
        out["stages"] = [f"{name}/{s.name}" for s in sorted(d.iterdir()) if s.is_dir() and is_run(s)] if "/" not in name else []
        out["episode_sources"] = episode_sources(d)
        return out

    def summaries(self) -> list[dict]:
        out = []
        for name in self.root.runs():
            try:
                out.append(self.summary(name))
            except (ConsoleError, FileNotFoundError):  # deleted between the listing and the summary
                continue
        return out

    # ---- config and evaluation ------------------------------------------------------------
    def config(self, name: str) -> dict:
        d = self.root.run_dir(name)
        cfg_file, cfg = read_config(d)
        if cfg_file is None or self.root.file(d, cfg_file) is None:
            raise ConsoleError(404, f"run {name!r} has no config.yaml, pipeline_config.json or team_train_config.json")
        text = (d / cfg_file).read_text(errors="replace")
        warnings = [] if cfg else [f"{cfg_file} could not be parsed; showing its text"]
        return {"file": cfg_file, "text": text, "config": cfg, "warnings": warnings}

    def evaluation(self, name: str) -> dict:
        """One row per (stage, set): passed, n, pass rate, 95% interval, agent metrics; from
        pipeline.json when there is one, else from every eval_*.json. `tests`: the paired tests."""
        d = self.root.run_dir(name)
        rows, tests, warnings = [], [], []
        summary = _load_json(d / "pipeline.json", warnings) if self.root.file(d, "pipeline.json") else {}
        if summary:
            for stage, r in (summary.get("stages") or {}).items():
                rows.append(_row(stage, "trained sets", r))
            for set_name, per in (summary.get("by_set") or {}).items():
                rows += [_row(stage, set_name, r) for stage, r in per.items()]
            for stage, r in (summary.get("humaneval") or {}).items():
                rows.append(_row(stage, "humaneval", r))
            tests = [{"name": k, **v} for k, v in summary.items() if isinstance(v, dict) and "p_value" in v]
        else:
            for p in sorted(d.glob("eval_*.json")):
                if self.root.file(d, p.name) is not None:
                    rows += _eval_file_rows(p.stem.removeprefix("eval_"), _load_json(p, warnings))
        return {"rows": rows, "tests": tests, "warnings": warnings}


def _load_json(p: Path, warnings: list[str] | None = None) -> dict:
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        if warnings is not None:
            warnings.append(f"{p.name} is not valid JSON ({e.msg}); skipped it")
        return {}
    return data if isinstance(data, dict) else {}


def _row(stage: str, set_name: str, r: dict) -> dict:
    ci = r.get("ci95") or [None, None]
    agent = r.get("agent") or {}
    return {"stage": stage, "set": set_name, "passed": r.get("passed"), "n": r.get("n"), "pass_rate": r.get("pass_rate"),
            "ci95_low": ci[0], "ci95_high": ci[1], **{k: agent.get(k) for k in AGENT_KEYS}}


def _eval_file_rows(stage: str, data: dict) -> list[dict]:
    """An EvalResult file (a trainer's eval_base/eval_trained: one result with its summary) or a
    pipeline stage's file (one EvalResult per set)."""
    if "summary" in data:
        return [_row(stage, "held-out", data["summary"])]
    rows = []
    for set_name, r in data.items():
        if isinstance(r, dict) and isinstance(r.get("passed"), list):
            n, passed = len(r["passed"]), sum(map(bool, r["passed"]))
            rows.append(_row(stage, set_name, {"passed": passed, "n": n, "pass_rate": passed / n if n else None,
                                               "agent": r.get("agent")}))
    return rows


class _Columns:
    """A metrics file's lines as columns, appended as the file grows: `line[i]` is row i's line
    number, `x[i]` its step, `columns[key][i]` its value of `key` (None where it has none)."""

    def __init__(self, generation: int):
        self.generation = generation  # of the JsonlFile the lines came from
        self.lines_read = 0
        self.line: list[int] = []
        self.x: list = []
        self.columns: dict[str, list] = {}
        self.first: dict[str, int] = {}  # the row where each key first appears
        self.warnings: list[tuple[int, str]] = []  # (line, warning)

    def extend(self, rows: list[tuple[int, dict]], warnings: list[tuple[int, str]], lines_read: int) -> None:
        for n, row in rows:
            i = len(self.x)
            step = row.get("step")
            self.line.append(n)
            self.x.append(step if isinstance(step, (int, float)) and not isinstance(step, bool) else n)
            for key, v in row.items():
                if key == "step" or isinstance(v, bool) or not (v is None or isinstance(v, (int, float))):
                    continue
                col = self.columns.get(key)
                if col is None:
                    col, self.first[key] = [None] * i, i
                    self.columns[key] = col
                col.append(v)
            for col in self.columns.values():
                if len(col) <= i:
                    col.append(None)
        self.warnings += warnings
        self.lines_read = lines_read

    def between(self, after: int, stop: int) -> dict:
        """The rows of lines after+1..stop and those lines' warnings; the columns of every key seen
        by then (a chart the page already has gets its gaps, a new one starts where its key does)."""
        i, j = bisect.bisect_right(self.line, after), bisect.bisect_right(self.line, stop)
        return {"x": self.x[i:j], "columns": {k: col[i:j] for k, col in self.columns.items() if self.first[k] < j},
                "warnings": [w for n, w in self.warnings if after < n <= stop]}
