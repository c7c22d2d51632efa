"""The audit log: one JSON line per exec, appended under a lock."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path


class AuditLog:
    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, sandbox_id: str, argv: list[str], limits: dict, stdin: bytes | None, result, started: float,
               refused: str | None = None) -> None:
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
        line = json.dumps(row) + "\n"
        with self._lock, self.path.open("a") as f:
            f.write(line)
