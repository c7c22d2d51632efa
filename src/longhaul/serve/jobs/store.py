"""Job records and the queue they wait in: the SQLite store (the default) and what every
store provides.

A job is one agent episode asked for over HTTP. Its record: id, owner (the API key's name),
status (`queued` -> `running` -> `succeeded` | `failed`), the validated spec, attempts,
timestamps, and the result (the trajectory) or the error. A store is the broker too:
`claim(worker, timeout)` hands the oldest queued job to a worker, `finish` / `fail` close it,
`release` puts it back (shutdown), `heartbeat` keeps a long job's claim alive, and
`recover(worker)` runs once at start so that a job a dead server was running is queued again:
a restart loses no job, and a job interrupted mid-episode is re-run from its start (an episode
is not resumable mid-way: its sandbox died with the process). `counts()` feeds the metrics.

SQLite (`SqliteJobStore`) serves one replica: every change is a committed transaction in WAL
mode, so a killed process leaves the file consistent. Several replicas share jobs through
Redis Streams (`redis_store.RedisJobStore`). Does not own running episodes (`runner`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Protocol

STATUSES = ("queued", "running", "succeeded", "failed")


def new_job_id() -> str:
    return f"job_{uuid.uuid4().hex}"


def new_record(spec: dict, owner: str) -> dict:
    return {"id": new_job_id(), "object": "job", "owner": owner, "status": "queued", "spec": spec, "attempts": 0,
            "created_at": time.time(), "started_at": None, "finished_at": None, "result": None, "error": None}


class JobStore(Protocol):
    def submit(self, spec: dict, owner: str, max_queued: int) -> dict | None: ...  # None: the queue is full
    def get(self, job_id: str) -> dict | None: ...
    def claim(self, worker: str, timeout: float) -> dict | None: ...
    def heartbeat(self, job: dict, worker: str) -> None: ...
    def finish(self, job: dict, result: dict) -> None: ...
    def fail(self, job: dict, error: str) -> None: ...
    def release(self, job: dict) -> None: ...
    def recover(self, worker: str) -> int: ...
    def counts(self) -> dict[str, int]: ...
    def close(self) -> None: ...


_SCHEMA = """CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL, spec TEXT NOT NULL, attempts INTEGER NOT NULL,
    created_at REAL NOT NULL, started_at REAL, finished_at REAL, heartbeat_at REAL, worker TEXT, result TEXT, error TEXT);
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs (status, created_at);"""
_COLUMNS = ("id", "owner", "status", "spec", "attempts", "created_at", "started_at", "finished_at", "result", "error")


class SqliteJobStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a job the server said it accepted is on disk
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)

    def _row(self, row) -> dict | None:
        if row is None:
            return None
        rec = dict(zip(_COLUMNS, row))
        rec["object"] = "job"
        rec["spec"] = json.loads(rec["spec"])
        rec["result"] = json.loads(rec["result"]) if rec["result"] else None
        return rec

    def submit(self, spec: dict, owner: str, max_queued: int) -> dict | None:
        rec = new_record(spec, owner)
        with self._lock:
            (queued,) = self._db.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()
            if queued >= max_queued:
                return None
            self._db.execute("INSERT INTO jobs (id, owner, status, spec, attempts, created_at) VALUES (?, ?, 'queued', ?, 0, ?)",
                             (rec["id"], owner, json.dumps(spec), rec["created_at"]))
            self._queued.notify()
        return rec

    def get(self, job_id: str) -> dict | None:
        with self._lock:
            return self._row(self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?", (job_id,)).fetchone())

    def claim(self, worker: str, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                now = time.time()
                row = self._db.execute(
                    "UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = ?, heartbeat_at = ?, worker = ? "
                    "WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY created_at LIMIT 1) "
                    f"RETURNING {', '.join(_COLUMNS)}", (now, now, worker)).fetchone()
                if row is not None:
                    return self._row(row)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._queued.wait(left)

    def heartbeat(self, job: dict, worker: str) -> None:
        with self._lock:
            self._db.execute("UPDATE jobs SET heartbeat_at = ? WHERE id = ? AND worker = ?", (time.time(), job["id"], worker))

    def _close_job(self, job: dict, status: str, result: dict | None, error: str | None) -> None:
        with self._lock:
            self._db.execute("UPDATE jobs SET status = ?, finished_at = ?, result = ?, error = ? WHERE id = ?",
                             (status, time.time(), json.dumps(result) if result is not None else None, error, job["id"]))

    def finish(self, job: dict, result: dict) -> None:
        self._close_job(job, "succeeded", result, None)

    def fail(self, job: dict, error: str) -> None:
        self._close_job(job, "failed", None, error)

    def release(self, job: dict) -> None:
        with self._lock:
            self._db.execute("UPDATE jobs SET status = 'queued', worker = NULL WHERE id = ? AND status = 'running'", (job["id"],))
            self._queued.notify()

    def recover(self, worker: str) -> int:
        """Queue again every job left running: this store has one replica, so they are all ours."""
        with self._lock:
            n = self._db.execute("UPDATE jobs SET status = 'queued', worker = NULL WHERE status = 'running'").rowcount
            self._queued.notify_all()
        return n

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = dict(self._db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
        return {s: rows.get(s, 0) for s in STATUSES}

    def close(self) -> None:
        with self._lock:
            self._queued.notify_all()
            self._db.close()
