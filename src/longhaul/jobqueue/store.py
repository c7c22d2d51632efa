"""The job queue's books: every submitted run and its state, in SQLite, so a restart of the
queue service loses no run and starts none twice.

A run moves queued -> starting -> running -> done | failed | cancelled, and back to queued when
it is pre-empted (it saved and exited 143), its node or process died, or the service restarted
and found its process gone. `move(id, frm, to)` is one conditional UPDATE: it happens only
from the states named, so two parties (a pass and a cancel) can never both move a run. The
service marks a run `starting` before it creates the run's process and `running` once it
exists; a restart finds a `starting` run either with its process (adopted) or without
(queued again), never both.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

STATES = ("queued", "starting", "running", "done", "failed", "cancelled")
LIVE = ("starting", "running")  # a process exists, or may
FINAL = ("done", "failed", "cancelled")


@dataclass
class RunRecord:
    id: str
    domain: str
    priority: int
    config: str  # the run's YAML, as submitted
    overrides: list[str] = field(default_factory=list)
    workdir: str = "."  # where the submitter stood: the run's relative paths resolve there
    cpus: float = 1.0
    mem_gb: float = 0.0
    gpus: int = 0
    # its work units in bundle order, each {kind, cpus, mem_gb, gpus} (`units.run_units`): the driver, then the
    # actors a Ray-backed run starts; empty: the driver alone, with cpus, mem_gb and gpus above
    units: list[dict] = field(default_factory=list)
    state: str = "queued"
    node: str = ""  # the Ray node ID its driver runs (or last ran) on: its checkpoint is cached there
    nodes: list[str] = field(default_factory=list)  # each unit's node, as `units`
    attempts: int = 0  # times its process started
    preemptions: int = 0
    submitted: float = 0.0
    started: float = 0.0
    ended: float = 0.0
    exit_code: int | None = None
    reason: str = ""  # why it is in its state, in a line (a failure's last error, a pre-emption)
    cancel: bool = False  # asked to cancel; the service stops it at its next pass

    def view(self) -> dict:
        """What `longhaul queue status` shows (no config text)."""
        out = asdict(self)
        out.pop("config")
        return out


_COLUMNS = [f.name for f in fields(RunRecord)]


class RunStore:
    """Runs in one SQLite file (WAL; safe against a crash between any two statements)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, "
                         "record TEXT NOT NULL, state TEXT NOT NULL)")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, rec: RunRecord) -> RunRecord:
        """Store a new run; its id is given here (`r0001`, ...), its submission time now."""
        with self._lock:
            cur = self._db.execute("INSERT INTO runs (id, record, state) VALUES (?, '{}', 'queued')", (f"tmp-{time.time_ns()}",))
            rec.id, rec.submitted, rec.state = f"r{cur.lastrowid:04d}", rec.submitted or time.time(), "queued"
            self._db.execute("UPDATE runs SET id = ?, record = ? WHERE seq = ?", (rec.id, _dump(rec), cur.lastrowid))
        return rec

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock:
            row = self._db.execute("SELECT record FROM runs WHERE id = ?", (run_id,)).fetchone()
        return _load(row[0]) if row else None

    def all(self, states: tuple[str, ...] | None = None) -> list[RunRecord]:
        """Runs in submission order, those in `states` only when given."""
        with self._lock:
            rows = self._db.execute("SELECT record, state FROM runs ORDER BY seq").fetchall()
        return [_load(r) for r, s in rows if states is None or s in states]

    def move(self, run_id: str, frm: tuple[str, ...], to: str, **changes) -> RunRecord | None:
        """Move a run to state `to` (with `changes`) if it is in one of `frm`; the record after, or None."""
        if to not in STATES:
            raise ValueError(f"unknown run state {to!r}; one of {', '.join(STATES)}")
        return self._change(run_id, frm, dict(changes, state=to))

    def update(self, run_id: str, **changes) -> RunRecord | None:
        """Change fields of a run whatever its state (not the state)."""
        if "state" in changes:
            raise ValueError("change a run's state with move(), which checks where it comes from")
        return self._change(run_id, STATES, changes)

    def _change(self, run_id: str, frm: tuple[str, ...], changes: dict) -> RunRecord | None:
        unknown = set(changes) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"runs have no field {sorted(unknown)[0]!r}")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT record FROM runs WHERE id = ?", (run_id,)).fetchone()
                if row is None or _load(row[0]).state not in frm:
                    self._db.execute("ROLLBACK")
                    return None
                rec = _load(row[0])
                for k, v in changes.items():
                    setattr(rec, k, v)
                self._db.execute("UPDATE runs SET record = ?, state = ? WHERE id = ?", (_dump(rec), rec.state, run_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return rec


def _dump(rec: RunRecord) -> str:
    return json.dumps(asdict(rec))


def _load(text: str) -> RunRecord:
    return RunRecord(**json.loads(text))
