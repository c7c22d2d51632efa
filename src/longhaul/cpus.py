"""How many CPUs this process may really use: its affinity mask, capped by a cgroup CPU quota.

`os.cpu_count()` counts the machine's CPUs; a Kubernetes pod with `limits.cpu: 2` on a 64-core
node, a `taskset`, or a container with `--cpus` gets far fewer. Running more compute threads
than that makes them wait at every parallel region for a peer that has no CPU to run on.

Reads cgroup v2 (`cpu.max`) and v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`) along the
process's cgroup path up to the root (a parent's quota binds too), and rounds the tightest
quota up to whole CPUs; measures what other processes use of those CPUs (`CpuLoad`); and sets
the niceness a worker process runs at (`match_priority`). Owns the count, the measurement and
the niceness; who uses how many threads is the caller's choice.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _ancestors(rel: str) -> list[str]:
    """'/a/b' -> ['/a/b', '/a', '/']."""
    parts = [p for p in rel.split("/") if p]
    return ["/" + "/".join(parts[:k]) for k in range(len(parts), -1, -1)]


def _quota_v2(root: Path, rel: str) -> float | None:
    best = None
    for d in _ancestors(rel):
        try:
            quota, period = (root / d.lstrip("/") / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max" and float(period) > 0:
            q = float(quota) / float(period)
            best = q if best is None else min(best, q)
    return best


def _quota_v1(root: Path, mount: str, rel: str) -> float | None:
    best = None
    for d in _ancestors(rel):
        base = root / mount / d.lstrip("/")
        try:
            quota, period = int((base / "cpu.cfs_quota_us").read_text()), int((base / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if quota > 0 and period > 0:
            best = quota / period if best is None else min(best, quota / period)
    return best


def cgroup_cpu_quota(proc_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time the process's cgroups allow (e.g. 1.5), or None when unlimited or unknown.
    `proc_cgroup` is the text of /proc/self/cgroup (read when None)."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    quotas = []
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hid == "0" and controllers == "":
            quotas.append(_quota_v2(root, rel))
        elif "cpu" in controllers.split(","):
            for mount in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                if (root / mount).is_dir():
                    quotas.append(_quota_v1(root, mount, rel))
                    break
    quotas = [q for q in quotas if q is not None]
    return min(quotas) if quotas else None


def available_cpus(proc_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> int:
    """Whole CPUs this process can run on at once: the affinity mask, capped by the quota rounded up."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota(proc_cgroup, root)
    if quota is not None:
        n = min(n, max(1, math.ceil(quota - 1e-9)))
    return max(1, n)


def _own_cgroup(proc_cgroup: str) -> tuple[str, str] | None:
    """('v2', path) or ('v1', cpuacct path) of this process's cgroup, from /proc/self/cgroup."""
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hid == "0" and controllers == "":
            return "v2", rel
        if "cpuacct" in controllers.split(","):
            return "v1", rel
    return None


def _cgroup_usage_reader(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> Callable[[], float] | None:
    """Seconds of CPU every process of this cgroup has used (cumulative), or None when unreadable."""
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text() if proc_cgroup is None else proc_cgroup
    except OSError:
        return None
    own = _own_cgroup(proc_cgroup)
    if own is None:
        return None
    kind, rel = own
    if kind == "v2":
        path = root / rel.lstrip("/") / "cpu.stat"

        def read() -> float:
            for line in path.read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            raise OSError(f"{path} has no usage_usec")
    else:
        path = next((root / m / rel.lstrip("/") / "cpuacct.usage" for m in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
                     if (root / m).is_dir()), None)
        if path is None:
            return None

        def read() -> float:
            return int(path.read_text()) / 1e9
    try:
        read()
    except (OSError, ValueError):
        return None
    return read


def proc_stat_busy(text: str, cpus: set[int], hz: int) -> float:
    """Busy seconds summed over `cpus` from the text of /proc/stat: user, nice, system, irq and
    softirq (guest time is inside user); idle, iowait and steal are time nothing here ran."""
    busy = 0
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if int(name[3:]) in cpus:
            f = [int(x) for x in fields]
            busy += f[0] + f[1] + f[2] + f[5] + f[6]
    return busy / hz


class CpuLoad:
    """What other processes use of the CPUs this process may run on, in CPUs, between readings.

    Busy time comes from the process's cgroup when a CPU quota binds it (`cpu.stat` in v2,
    `cpuacct.usage` in v1: a pod's neighbours on the node are not ours to yield to), otherwise
    from /proc/stat over the CPUs of the affinity mask; this process's own time
    (`time.process_time`, every thread) is taken off. Other processes include this one's children
    (a sandboxed command competes like any other). `open()` is None where neither is readable."""

    def __init__(self, cpus: int, busy: Callable[[], float], own: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic):
        self.cpus, self._busy, self._own, self._clock = cpus, busy, own, clock
        self._last = self._read()

    @classmethod
    def open(cls) -> "CpuLoad | None":
        try:
            mask = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return None
        busy = _cgroup_usage_reader() if cgroup_cpu_quota() is not None else None
        if busy is None:
            hz = os.sysconf("SC_CLK_TCK")
            stat = Path("/proc/stat")

            def busy() -> float:
                return proc_stat_busy(stat.read_text(), mask, hz)
        try:
            busy()
        except (OSError, ValueError):
            return None
        return cls(available_cpus(), busy)

    def _read(self) -> tuple[float, float, float]:
        return self._clock(), self._busy(), self._own()

    def elapsed(self) -> float:
        """Seconds since the last reading."""
        return self._clock() - self._last[0]

    def others(self) -> tuple[float, float]:
        """(seconds since the last reading, CPUs' worth other processes used over them)."""
        t, busy, own = self._read()
        t0, busy0, own0 = self._last
        self._last = (t, busy, own)
        dt = t - t0
        return dt, (max(0.0, (busy - busy0) - (own - own0)) / dt if dt > 0 else 0.0)


def apply_default_threads() -> int:
    """Lower torch's intra-op threads to `available_cpus()` unless the user set OMP_NUM_THREADS;
    returns the count in force."""
    import torch

    if not os.environ.get("OMP_NUM_THREADS"):
        n = available_cpus()
        if torch.get_num_threads() > n:
            torch.set_num_threads(n)
    return torch.get_num_threads()


def own_priority() -> int:
    """This thread's niceness: what the actors this process creates should run at."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def match_priority(nice: int) -> None:
    """Bring every thread of this actor's process to niceness `nice` (its creator's).

    Ray starts its workers at niceness 15 (`RAY_worker_niceness`) so that its own daemons stay
    responsive; but here the actors are the run's work, and at 15 beside one ordinary busy
    process an actor gets about 1.5% of a core (CFS weights 36 against 1024): a run starves as
    soon as anything else computes on the node. Niceness on Linux is per thread, and Ray's threads
    exist before the actor's `__init__`, so each one is set; threads started later inherit it.
    Raising priority needs root or CAP_SYS_NICE: without them the actor says so once and keeps
    Ray's niceness (start the cluster with `RAY_worker_niceness=0 ray start --head` instead)."""
    if own_priority() <= nice:
        return
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            except ProcessLookupError:  # the thread ended meanwhile
                pass
    except PermissionError:
        print(f"longhaul: this Ray actor runs at niceness {own_priority()}, its driver at {nice}, and may not raise "
              f"its priority (needs root or CAP_SYS_NICE): it will starve beside busy processes; start the cluster "
              f"with `RAY_worker_niceness={nice} ray start --head`", flush=True)
