"""CPUs available to the process: affinity mask and cgroup v1/v2 quotas, on a fake cgroup tree."""

import os

from longhaul.cpus import available_cpus, cgroup_cpu_quota


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_quota_is_the_tightest_along_the_path(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000\n")
    _write(tmp_path / "kubepods/cpu.max", "300000 100000\n")  # 3 CPUs for the pod
    _write(tmp_path / "kubepods/pod1/cpu.max", "150000 100000\n")  # 1.5 for the container
    assert cgroup_cpu_quota("0::/kubepods/pod1\n", tmp_path) == 1.5
    _write(tmp_path / "kubepods/pod1/cpu.max", "max 100000\n")
    assert cgroup_cpu_quota("0::/kubepods/pod1\n", tmp_path) == 3.0  # a parent's quota binds too


def test_v1_quota_and_unlimited(tmp_path):
    text = "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    base = tmp_path / "cpu,cpuacct/docker/abc"
    _write(base / "cpu.cfs_quota_us", "50000\n")
    _write(base / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(text, tmp_path) == 0.5
    _write(base / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_quota(text, tmp_path) is None
    assert cgroup_cpu_quota("0::/\n", tmp_path) is None  # no cpu.max file: unknown, not zero


def test_available_cpus_rounds_the_quota_up_and_never_exceeds_the_affinity_mask(tmp_path):
    mask = len(os.sched_getaffinity(0))
    _write(tmp_path / "a/cpu.max", "150000 100000\n")
    assert available_cpus("0::/a\n", tmp_path) == min(mask, 2)
    _write(tmp_path / "a/cpu.max", "20000 100000\n")
    assert available_cpus("0::/a\n", tmp_path) == 1  # a fifth of a CPU still runs one thread
    _write(tmp_path / "a/cpu.max", f"{(mask + 8) * 100000} 100000\n")
    assert available_cpus("0::/a\n", tmp_path) == mask


_NICED_CHILD = """
import os, sys, threading
from longhaul.cpus import match_priority
os.nice(10)  # as Ray starts its workers, with a thread already running
hold = threading.Event()
t = threading.Thread(target=hold.wait)
t.start()
match_priority(int(sys.argv[1]))
print(sorted({os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")}))
hold.set()
"""


def test_match_priority_sets_every_thread_or_says_why_not():
    import subprocess
    import sys

    base = os.getpriority(os.PRIO_PROCESS, 0)
    r = subprocess.run([sys.executable, "-c", _NICED_CHILD, str(base + 3)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    if os.geteuid() == 0:  # root may raise priority: every thread, the one started before too
        assert r.stdout.strip() == f"[{base + 3}]"
    else:
        assert "may not raise its priority" in r.stdout and "RAY_worker_niceness" in r.stdout
