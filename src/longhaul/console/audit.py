"""A run's sandbox audit log (`<run>/audit.jsonl`, written by `sandbox.audit`) as the commands of
one episode: every command its sandbox ran (set-up, the agent's session, its checks) and those of
the fresh sandboxes its checks ran in, which name the episode's sandbox in their rows.

`Audits` indexes each log incrementally by sandbox, so an episode page of a run that is still
writing costs only the lines appended since the last read. Reads; writes nothing.
"""

from __future__ import annotations

import re

from longhaul.console.jsonl import Derived, JsonlCache, parse_lines
from longhaul.console.paths import ConsoleError, RunsRoot

SANDBOX_ID = re.compile(r"^[0-9a-f]{6,32}$")
INDEXED = 8  # audit logs whose index stays in memory (the runs opened last)
FIELDS = ("time", "sandbox", "episode", "argv", "exit_code", "signal", "limit_hit", "refused", "wall_s", "cpu_s", "peak_rss",
          "stdout_bytes", "stderr_bytes", "truncated")


class _Index:
    def __init__(self, generation: int):
        self.generation = generation
        self.lines_read = 0
        self.by_sandbox: dict[str, list[dict]] = {}
        self.warnings: list[str] = []


class Audits:
    def __init__(self, root: RunsRoot):
        self.root = root
        self.cache = JsonlCache()
        self._indexes = Derived(INDEXED)

    def episode(self, run: str, sandbox: str) -> dict:
        """The audit rows of episode sandbox `sandbox` of `run`, in the order they were written."""
        if not SANDBOX_ID.match(sandbox or ""):
            raise ConsoleError(400, f"sandbox {sandbox!r} is not a sandbox id; take it from the episode's info.sandbox")
        d = self.root.run_dir(run)
        path = self.root.file(d, "audit.jsonl")
        if path is None:
            raise ConsoleError(404, f"run {run!r} has no audit log (it ran with log.audit: false, or before runs wrote one)")
        f = self.cache.get(path)
        with f.lock:
            try:
                f.refresh()
            except FileNotFoundError as e:
                raise ConsoleError(404, f"the audit log of run {run!r} is gone (deleted while open?)") from e
            index, _ = self._indexes.get(f, _Index)
            if index.lines_read < len(f):
                rows, warnings = parse_lines(f.lines(index.lines_read, len(f)), index.lines_read, "audit.jsonl")
                for _, row in rows:
                    key = row.get("episode") or row.get("sandbox")
                    if isinstance(key, str):
                        index.by_sandbox.setdefault(key, []).append({k: row.get(k) for k in FIELDS if k in row})
                index.warnings += warnings
                index.lines_read = len(f)
            return {"sandbox": sandbox, "rows": list(index.by_sandbox.get(sandbox, [])), "warnings": list(index.warnings)}
