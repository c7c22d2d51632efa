"""The audit log: one JSON line per command a sandbox ran (an exec, or a command of its shell
session), appended with one write to a file opened for appending, so that the processes of a run
(rollout workers, checkers) share one file without tearing each other's lines.

`AUDIT_ENV` names the file a run's sandboxes write to when they are given none: a training run
sets it to `<run>/audit.jsonl` (`log.audit`), and the processes it starts inherit it. A row's
`sandbox` is the sandbox that ran the command; `episode`, where set, the sandbox of the episode the
command belongs to (the fresh copy an episode's check runs in names the episode's own sandbox).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from pathlib import Path

AUDIT_ENV = "LONGHAUL_AUDIT_LOG"


@contextlib.contextmanager
def audit_to(path: str | Path | None):
    """Within the block, sandboxes given no log of their own (and the processes started here)
    write to `path`; None: to none. The variable's earlier value comes back after."""
    before = os.environ.get(AUDIT_ENV)
    if path:
        os.environ[AUDIT_ENV] = str(path)
    else:
        os.environ.pop(AUDIT_ENV, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(AUDIT_ENV, None)
        else:
            os.environ[AUDIT_ENV] = before


class AuditLog:
    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls) -> "AuditLog":
        """The log `AUDIT_ENV` names, or one that records nothing."""
        return cls(os.environ.get(AUDIT_ENV) or None)

    def record(self, sandbox_id: str, argv: list[str], limits: dict, stdin: bytes | None, result, started: float,
               refused: str | None = None, episode: str | None = None) -> None:
        if not self.path:
            return
        row = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)) + f".{int(started % 1 * 1000):03d}Z",
            "sandbox": sandbox_id, "argv": argv, "limits": limits,
            "exit_code": result.exit_code, "signal": result.signal, "limit_hit": result.limit_hit,
            "wall_s": round(result.wall_s, 6), "cpu_s": round(result.cpu_s, 6), "peak_rss": result.peak_rss,
            "stdout_bytes": len(result.stdout.encode("utf-8", "replace")), "stderr_bytes": len(result.stderr.encode("utf-8", "replace")),
            "truncated": result.truncated,
            "stdin_sha256": hashlib.sha256(stdin).hexdigest() if stdin else None,
        }
        if refused:
            row["refused"] = refused
        if episode and episode != sandbox_id:
            row["episode"] = episode
        data = (json.dumps(row) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                while data:  # one write a line in practice; an appending write is atomic on a local file
                    data = data[os.write(fd, data):]
            finally:
                os.close(fd)
