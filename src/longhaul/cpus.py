"""How many CPUs this process may really use: its affinity mask, capped by a cgroup CPU quota.

`os.cpu_count()` counts the machine's CPUs; a Kubernetes pod with `limits.cpu: 2` on a 64-core
node, a `taskset`, or a container with `--cpus` gets far fewer. Running more compute threads
than that makes them wait at every parallel region for a peer that has no CPU to run on.

Reads cgroup v2 (`cpu.max`) and v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`) along the
process's cgroup path up to the root (a parent's quota binds too), and rounds the tightest
quota up to whole CPUs; and sets the niceness a worker process runs at (`match_priority`). Owns
the count and the niceness; who uses how many threads is the caller's choice.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

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
