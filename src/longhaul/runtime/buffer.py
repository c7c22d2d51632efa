"""The replay buffer between rollout workers and the trainer.

Owns finished groups of trajectories (one group = one task's samples) from the moment a worker
hands them over until the trainer has consumed them: bounded (`put` waits for room, so a fast
producer is held back instead of growing memory), indexed by weight version, by task and by
role, sampled in FIFO, recency or priority order, and written through to a JSONL log so that a
crash loses no finished group. A multi-agent episode puts one group a role (its trajectories
carry `info["role"]`), and the trainer takes a role's groups with `take(..., role=...)`;
single-agent groups have no role (None). Every group carries a unique id (request, task,
round); a second copy of an id (a requeued request that had in fact finished) is rejected.

The log holds one `put` line per group and one `take` line per trainer step naming the ids it
consumed. `ReplayBuffer.open(path, resume_step=k)` rebuilds the buffer as it stood after step k:
groups consumed by steps <= k are gone, groups consumed by later (not checkpointed) steps are
back, in their original order, so a resumed run retrains them exactly.

Not owned here: which requests get generated (the controller's admission control) and what
a group is worth (the trainer).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from longhaul.types import Trajectory

Order = Literal["fifo", "recency", "priority"]


@dataclass
class Entry:
    uid: str  # unique across the run: "<step>.<round>/<task position>"
    step: int  # the training step whose request produced it
    round: int  # 0, or the dynamic-sampling refill round
    index: int  # position of the task within its request (keeps FIFO order deterministic)
    task_id: str
    group: list[Trajectory]
    priority: float = 0.0  # larger is sampled first under order="priority" (default: reward spread)
    seq: int = 0  # arrival order in this buffer
    added: float = field(default_factory=time.time)

    @property
    def version(self) -> int:
        """The oldest weight version behind any token of the group."""
        return min((t.min_version for t in self.group), default=0)

    @property
    def role(self) -> str | None:
        """The role whose samples the group holds (a multi-agent episode's); None for a single agent."""
        return self.group[0].info.get("role") if self.group else None

    def to_json(self) -> dict:
        return {"op": "put", "uid": self.uid, "step": self.step, "round": self.round, "index": self.index,
                "task_id": self.task_id, "priority": self.priority, "group": [t.to_dict() for t in self.group]}

    @classmethod
    def from_json(cls, d: dict) -> Entry:
        return cls(d["uid"], d["step"], d["round"], d["index"], d["task_id"], [Trajectory.from_dict(t) for t in d["group"]],
                   d.get("priority", 0.0))


def reward_spread(group: list[Trajectory]) -> float:
    """The default priority: groups whose rewards differ more carry more policy gradient."""
    rs = [t.reward for t in group]
    return max(rs) - min(rs) if rs else 0.0


class ReplayBuffer:
    def __init__(self, capacity: int, path: Path | None = None, order: Order = "fifo"):
        if capacity < 1:
            raise ValueError(f"replay buffer capacity must be >= 1, got {capacity}")
        self.capacity, self.path, self.order = capacity, path, order
        self._entries: dict[str, Entry] = {}
        self._seen: set[str] = set()  # every uid ever put (consumed ones too): duplicates are rejected
        self._by_version: dict[int, set[str]] = {}
        self._by_task: dict[str, set[str]] = {}
        self._by_role: dict[str | None, set[str]] = {}
        self._cond = threading.Condition()
        self._seq = 0
        self._log = None
        self._opened_rows: list[dict] = []
        self.duplicates_rejected = 0
        self.put_total = 0
        self.taken_total = 0
        self.put_wait_s = 0.0  # producers held back by a full buffer (the trainer is behind)
        self.take_wait_s = 0.0  # the trainer waiting for groups (the rollouts are behind)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._log = path.open("a", encoding="utf-8")

    # ---- producer side ----------------------------------------------------------------
    def put(self, entry: Entry, timeout: float | None = None) -> bool:
        """Add a group; False if its uid was seen before (nothing is written). Waits while the
        buffer is full (raises TimeoutError after `timeout` seconds)."""
        roles = {t.info.get("role") for t in entry.group}
        if len(roles) > 1:
            raise ValueError(f"group {entry.uid} mixes roles {sorted(map(str, roles))}; put each role's samples as a group of its own")
        line = json.dumps(entry.to_json()) if self.path is not None else ""  # encoded before the lock: other callers go on
        with self._cond:
            if entry.uid in self._seen:
                self.duplicates_rejected += 1
                return False
            t0 = time.perf_counter()
            room = self._cond.wait_for(lambda: len(self._entries) < self.capacity, timeout)
            self.put_wait_s += time.perf_counter() - t0
            if not room:
                raise TimeoutError(f"replay buffer full ({self.capacity} groups) for {timeout}s: the trainer is not consuming")
            self._write(line)
            self._admit(entry)
            self.put_total += 1
            self._cond.notify_all()
            return True

    def _admit(self, entry: Entry) -> None:
        self._seq += 1
        entry.seq = self._seq
        self._seen.add(entry.uid)
        self._entries[entry.uid] = entry
        self._by_version.setdefault(entry.version, set()).add(entry.uid)
        self._by_task.setdefault(entry.task_id, set()).add(entry.uid)
        self._by_role.setdefault(entry.role, set()).add(entry.uid)

    # ---- consumer side ----------------------------------------------------------------
    def take(self, n: int, step: int, select=None, timeout: float | None = None, order: Order | None = None,
             role: str | None = None) -> list[Entry]:
        """Remove and return `n` entries for training step `step`, waiting until that many of
        `role`'s groups (default: any role's) match `select(entry)` (default: all). The
        consumption is logged under `step`."""
        pick = select or (lambda e: True)
        with self._cond:
            t0 = time.perf_counter()
            ok = self._cond.wait_for(lambda: sum(1 for e in self._candidates(role) if pick(e)) >= n, timeout)
            self.take_wait_s += time.perf_counter() - t0
            if not ok:
                which = f" of role {role!r}" if role is not None else ""
                raise TimeoutError(f"waited {timeout}s for {n} groups{which} for step {step}; {len(self._entries)} buffered")
            chosen = self._ordered([e for e in self._candidates(role) if pick(e)], order or self.order)[:n]
            self._remove(chosen, step)
            return chosen

    def select(self, pick, role: str | None = None) -> list[Entry]:
        """The buffered entries of `role` (default: any) matching `pick`, in FIFO order (nothing is removed)."""
        with self._cond:
            return self._ordered([e for e in self._candidates(role) if pick(e)], "fifo")

    def _candidates(self, role: str | None):
        if role is None:
            return self._entries.values()
        return [self._entries[u] for u in self._by_role.get(role, ())]

    def wait_change(self, timeout: float) -> None:
        """Sleep until something is put or taken, or `timeout` passes."""
        with self._cond:
            self._cond.wait(timeout)

    def note(self, row: dict) -> None:
        """Append a control row (the controller's request submissions) to the log."""
        with self._cond:
            self._write(json.dumps(row))

    def notes(self, op: str) -> list[dict]:
        """The control rows of kind `op` (not "put") this buffer was opened with (see `open`)."""
        return [r for r in self._opened_rows if r["op"] == op]

    def drop(self, entries: list[Entry], step: int) -> None:
        """Remove entries without training on them (e.g. groups past the staleness bound)."""
        with self._cond:
            self._remove([e for e in entries if e.uid in self._entries], step, dropped=True)

    def _remove(self, chosen: list[Entry], step: int, dropped: bool = False) -> None:
        for e in chosen:
            del self._entries[e.uid]
            for index, key in ((self._by_version, e.version), (self._by_task, e.task_id), (self._by_role, e.role)):
                index[key].discard(e.uid)
                if not index[key]:  # an index keeps no empty keys: a long run's memory stays flat
                    del index[key]
        if chosen:
            self._write(json.dumps({"op": "drop" if dropped else "take", "step": step, "uids": [e.uid for e in chosen]}))
        if not dropped:
            self.taken_total += len(chosen)
        self._cond.notify_all()

    @staticmethod
    def _ordered(entries: list[Entry], order: Order) -> list[Entry]:
        if order == "fifo":  # by request, then task position: the order a synchronous run sees
            return sorted(entries, key=lambda e: (e.step, e.round, e.index))
        if order == "recency":
            return sorted(entries, key=lambda e: -e.seq)
        if order == "priority":
            return sorted(entries, key=lambda e: (-e.priority, e.step, e.round, e.index))
        raise ValueError(f"unknown buffer order {order!r}; use fifo, recency or priority")

    # ---- views ------------------------------------------------------------------------
    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    def __contains__(self, uid: str) -> bool:
        with self._cond:
            return uid in self._seen

    def by_version(self, version: int) -> list[Entry]:
        with self._cond:
            return [self._entries[u] for u in sorted(self._by_version.get(version, ()))]

    def by_task(self, task_id: str) -> list[Entry]:
        with self._cond:
            return [self._entries[u] for u in sorted(self._by_task.get(task_id, ()))]

    def versions(self) -> dict[int, int]:
        """Buffered groups per weight version."""
        with self._cond:
            return {v: len(u) for v, u in sorted(self._by_version.items())}

    def by_role(self, role: str | None) -> list[Entry]:
        with self._cond:
            return [self._entries[u] for u in sorted(self._by_role.get(role, ()))]

    def roles(self) -> dict[str | None, int]:
        """Buffered groups per role (None: single-agent groups)."""
        with self._cond:
            return {r: len(u) for r, u in sorted(self._by_role.items(), key=lambda kv: (kv[0] is not None, kv[0] or ""))}

    # ---- persistence ------------------------------------------------------------------
    def _write(self, line: str) -> None:
        if self._log is None:
            return
        self._log.write(line + "\n")
        self._log.flush()
        os.fsync(self._log.fileno())  # a finished group survives a crash of this process

    def close(self) -> None:
        with self._cond:
            if self._log is not None:
                self._log.close()
                self._log = None

    @classmethod
    def open(cls, path: Path, capacity: int, order: Order = "fifo", resume_step: int | None = None) -> ReplayBuffer:
        """A buffer over the log at `path`. With `resume_step`, the log is rewritten to the state
        after that step (see the module docstring) and its entries are loaded; without, a log
        left there is an error (it belongs to another run)."""
        path = Path(path)
        if path.exists() and path.stat().st_size and resume_step is None:
            raise FileExistsError(f"replay log {str(path)!r} exists; resume the run or start a new one")
        kept: list[dict] = []
        if resume_step is not None and path.exists():
            kept = _replay(path, resume_step)
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
            os.replace(tmp, path)
        live = _live(kept)
        buf = cls(max(capacity, len(live)), path, order)
        buf._opened_rows = [r for r in kept if r["op"] != "put"]  # control rows; the groups live in the entries
        for row in kept:
            if row["op"] != "put":
                continue
            entry = Entry.from_json(row)
            if entry.uid in live:
                buf._admit(entry)
            else:
                buf._seen.add(entry.uid)
        return buf


def _replay(path: Path, step: int) -> list[dict]:
    """The log's rows up to `step`: puts and consumptions of steps <= step; consumptions of later
    steps are forgotten (those steps will run again). A torn last line (a crash mid-write) is dropped."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row["op"] in ("put", "submit") or row["step"] <= step:
            rows.append(row)
    return rows


def _live(rows: list[dict]) -> set[str]:
    gone = {u for r in rows if r["op"] in ("take", "drop") for u in r["uids"]}
    return {r["uid"] for r in rows if r["op"] == "put" and r["uid"] not in gone}
