"""Whatever a sandbox starts is stopped and reaped on every path (wall clock, output cap,
session close, the check server's timer), with and without cgroups and as an unprivileged user:
the watchdog kills through the pid namespace, not through cgroups."""

import shutil

import pytest

from tests.sandbox import modes
from tests.sandbox.modes import host_pids
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


# A subreaper receives every orphan of its tree, as the host's init (or longhaul as a
# container's PID 1) would: any zombie it holds afterwards is one the sandbox left unreaped.
REAPING = r'''
import ctypes, json, os
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
from longhaul.sandbox import PythonChecker, Sandbox, SandboxSpec

hits = []
with Sandbox(SandboxSpec(wall_s=30, cpu_s=30, memory_bytes=256 << 20, output_bytes=64 << 10)) as sb:
    for argv in (["sleep", "1000"], ["sh", "-c", "sleep 1000 & sleep 1000"], ["sh", "-c", "trap '' TERM; sleep 1000"],
                 ["python3", "-c", "import os, time\nif os.fork() == 0: os.setsid()\ntime.sleep(1000)"]):
        hits.append(sb.exec(argv, timeout=1).limit_hit)
    hits.append(sb.exec(["yes"], timeout=60).limit_hit)
    s = sb.open_session()
    s.run("sleep 1000 & (setsid sleep 1000 &)", timeout=30)
    s.close()
with PythonChecker(SandboxSpec(wall_s=30, cpu_s=10)) as c:
    # a check that ignores the server's alarm hangs the server: the checker's own timer stops it
    hits.append(c.check("import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(1000)", timeout=1).limit_hit)
    hits.append(c.check("print(1)").stdout)
me = str(os.getpid())
zombies = []
for p in os.listdir("/proc"):
    try:
        fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        continue
    if fields[0] == "Z" and fields[1] == me:
        zombies.append(p)
print(json.dumps({"hits": hits, "zombies": zombies}))
'''


def _fast(keep: str) -> list:
    """modes.MODES with all but `keep` in the slow suite (each mode's run takes ~10 s; the fast
    suite keeps one mode a test, a different one for each)."""
    return [m if m == keep else pytest.param(m, marks=pytest.mark.slow) for m in modes.MODES]


@pytest.mark.parametrize("mode", _fast("unprivileged"))
def test_every_stop_path_reaps_what_it_started(mode):
    res = modes.script(mode, REAPING)
    assert res["hits"] == ["wall", "wall", "wall", "wall", "output", "wall", "1\n"], res
    assert res["zombies"] == [], res


@pytest.mark.parametrize("mode", _fast("no-cgroups"))
def test_wall_clock_and_output_cap_stop_the_whole_tree(mode):
    res = modes.cli_json(mode, "--wall", "1", "--", "sleep", "4949.25")
    assert res["limit_hit"] == "wall" and res["exit_code"] is None, res
    res = modes.cli_json(mode, "--wall", "2", "--", "yes")
    assert res["limit_hit"] == "output" and res["truncated"], {k: v for k, v in res.items() if k != "stdout"}
    res = modes.cli_json(mode, "--wall", "1", "--", "sh", "-c", "(setsid sleep 4949.5 > /dev/null 2>&1 &); trap '' TERM; sleep 4949.75")
    assert res["limit_hit"] == "wall", res
    res = modes.cli_json(mode, "--wall", "60", "--", "sh", "-c", "(setsid sleep 4949.875 &) ; echo started")
    assert res["exit_code"] == 0 and res["limit_hit"] is None and res["stdout"] == "started\n", res
    wait_until(lambda: not host_pids("sleep 4949"), what="every sandboxed sleep to be gone")


@pytest.mark.parametrize("mode", ["cgroups", "no-cgroups"])
def test_process_backend_wall_clock_without_cgroups(mode):
    res = modes.cli_json(mode, "--backend", "process", "--wall", "1", "--", "sh", "-c", "(setsid sleep 5050.25 &); sleep 5050.5")
    assert res["limit_hit"] == "wall", res
    wait_until(lambda: not host_pids("sleep 5050"), what="the process backend's sleeps to be gone")
