"""Per-sandbox memory and pids cgroups, v2 or v1, when this machine lets us write them.

`CGroup.create()` returns None where cgroups are not writable (not root, read-only mount,
no controllers): the sandbox then falls back to rlimits and says so. A cgroup's name carries
its owner (`longhaul-<pid>.<start time>-<hex>`), so `sweep()` can remove those a killed
caller left behind, and only those.
"""

from __future__ import annotations

import errno
import os
import time
import uuid
from pathlib import Path

from longhaul.sandbox import procs

ROOT = Path("/sys/fs/cgroup")


def _write(path: Path, value) -> None:
    path.write_text(str(value))


def _counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


class CGroup:
    """One sandbox's cgroup(s): memory and pids limits, counters, and a kill-everything."""

    def __init__(self, dirs: dict[str, Path], version: int):
        self.dirs, self.version = dirs, version

    @classmethod
    def create(cls, memory_bytes: int, pids: int) -> "CGroup | None":
        name = f"longhaul-{procs.owner_token()}-{uuid.uuid4().hex[:8]}"
        try:
            if (ROOT / "cgroup.controllers").is_file():  # v2
                parent = ROOT / "longhaul"
                parent.mkdir(exist_ok=True)
                ctrls = (ROOT / "cgroup.controllers").read_text().split()
                if not {"memory", "pids"} <= set(ctrls):
                    return None
                _write(ROOT / "cgroup.subtree_control", "+memory +pids")
                _write(parent / "cgroup.subtree_control", "+memory +pids")
                d = parent / name
                d.mkdir()
                _write(d / "memory.max", memory_bytes)
                _write(d / "memory.swap.max", 0) if (d / "memory.swap.max").exists() else None
                _write(d / "pids.max", pids)
                return cls({"memory": d, "pids": d, "cpu": d}, 2)
            mem, pid = ROOT / "memory", ROOT / "pids"
            if not (os.access(mem, os.W_OK) and os.access(pid, os.W_OK)):
                return None
            dirs = {"memory": mem / name, "pids": pid / name}
            if os.access(ROOT / "cpuacct", os.W_OK):
                dirs["cpu"] = ROOT / "cpuacct" / name
            for d in dirs.values():
                d.mkdir()
            _write(dirs["memory"] / "memory.limit_in_bytes", memory_bytes)
            if (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                try:
                    _write(dirs["memory"] / "memory.memsw.limit_in_bytes", memory_bytes)
                except OSError:
                    pass
            _write(dirs["pids"] / "pids.max", pids)
            return cls(dirs, 1)
        except OSError:
            return None

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in {id(d): d for d in self.dirs.values()}.values()]

    def add_self(self) -> None:
        """Called in the child before exec: everything it starts is accounted here."""
        for f in self.procs_files():
            f.write_text("0" if self.version == 2 else str(os.getpid()))

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files():
            try:
                out.update(int(x) for x in f.read_text().split())
            except OSError:
                pass
        return sorted(out)

    def counters(self) -> dict:
        """Monotonic counters: oom kills, fork refusals; and peak memory (reset by `reset_peak`)."""
        m, p, c = self.dirs["memory"], self.dirs["pids"], self.dirs.get("cpu")
        if self.version == 2:
            peak = int((m / "memory.peak").read_text()) if (m / "memory.peak").exists() else 0
            return {"oom_kill": _counter(m / "memory.events", "oom_kill"), "pids_max": _counter(p / "pids.events", "max"),
                    "peak": peak, "cpu_ns": _counter(m / "cpu.stat", "usage_usec") * 1000}
        fail = int((m / "memory.failcnt").read_text() or 0)
        out = {"oom_kill": _counter(m / "memory.oom_control", "oom_kill") or 0, "mem_fail": fail,
               "pids_max": _counter(p / "pids.events", "max"), "peak": int((m / "memory.max_usage_in_bytes").read_text())}
        if c is not None:
            out["cpu_ns"] = int((c / "cpuacct.usage").read_text())
        return out

    def reset_peak(self) -> None:
        if self.version == 1:
            try:
                _write(self.dirs["memory"] / "memory.max_usage_in_bytes", 0)
            except OSError:
                pass

    def kill_all(self) -> list[int]:
        """SIGKILL every task until none is left; returns what was killed, for `procs.reap`."""
        killed: set[int] = set()
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            killed.update(pids)
            if self.version == 2 and (self.dirs["pids"] / "cgroup.kill").exists():
                _write(self.dirs["pids"] / "cgroup.kill", 1)
            else:
                procs.kill_pids(pids)
            time.sleep(0.01)
        return sorted(killed)

    def remove(self) -> None:
        procs.reap(self.kill_all())
        for d in {id(d): d for d in self.dirs.values()}.values():
            _rmdir(d)


def _rmdir(d: Path) -> None:
    for _ in range(100):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:  # not ours to remove
                return
            time.sleep(0.01)  # busy until the last task is gone


def sweep() -> None:
    """Remove the cgroups of sandboxes whose owner process has died (killing what is still in
    them); cgroups of live owners, and names that are not ours, are left alone."""
    parents = [ROOT / "longhaul"] if (ROOT / "cgroup.controllers").is_file() else [ROOT / c for c in ("memory", "pids", "cpuacct")]
    for parent in parents:
        if not os.access(parent, os.W_OK):
            continue
        try:
            names = [n for n in os.listdir(parent) if n.startswith("longhaul-")]
        except OSError:
            continue
        for name in names:
            owner = name.split("-")[1]
            if procs.owner_alive(owner):
                continue
            d = parent / name
            stale = CGroup({"memory": d, "pids": d}, 2 if parent.name == "longhaul" else 1)
            procs.reap(stale.kill_all())
            _rmdir(d)
