"""A killed caller leaves nothing running (the process backend: nothing once the next sandbox
starts), and the next start removes its root directory, workdir mount, cgroups and uid claim,
only once their owner is dead; SIGTERM to the CLI cleans up at once."""

import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.sandbox import modes
from tests.sandbox.modes import host_pids, running_sandbox, sandboxed
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.mark.parametrize("mode", modes.MODES)
def test_a_killed_caller_leaves_nothing_after_the_next_start(mode):
    cli = modes.popen_cli(mode, "--wall", "600", "--", "sleep", "4747.25")
    try:
        wait_until(lambda: sandboxed(cli.pid, "sleep"), what="the sandboxed sleep to start")
        root, cgroups = running_sandbox(cli.pid)
        cli.send_signal(signal.SIGKILL)
        cli.wait()
    finally:
        cli.kill()
    # its processes die with it (bubblewrap's parent-death signal, then the pid namespace) ...
    wait_until(lambda: not host_pids("sleep 4747.25"), what="the killed caller's sleep to be gone")
    # ... its root directory (and cgroups) stay until the next start removes them
    assert root.exists()
    assert modes.cli_json(mode, "--", "true")["exit_code"] == 0
    assert not root.exists()
    for cg in cgroups:  # /longhaul-<owner>-<id> in each v1 hierarchy, or /longhaul/longhaul-<owner>-<id> (v2)
        assert not list(Path("/sys/fs/cgroup").glob(f"*{cg}")) and not Path(f"/sys/fs/cgroup{cg}").exists(), cg


@pytest.mark.skipif(os.geteuid() != 0, reason="the process backend's processes are named by a uid claim only as root")
@pytest.mark.parametrize("mode", ["cgroups", "no-cgroups"])
def test_a_killed_callers_process_backend_daemons_are_killed_by_the_next_start(mode):
    # no namespace dies with the caller here: its cgroup, or else its released uid claim, names what is left
    cli = modes.popen_cli(mode, "--backend", "process", "--wall", "600", "--", "sh", "-c", "(setsid sleep 5151.25 &); sleep 5151.5")
    daemons = lambda: modes.running("sleep", "5151.25") + modes.running("sleep", "5151.5")  # noqa: E731
    try:
        wait_until(lambda: len(daemons()) == 2, what="both sleeps to start")
        cli.send_signal(signal.SIGKILL)
        cli.wait()
    finally:
        cli.kill()
    assert len(daemons()) == 2  # the process backend's daemons outlive a killed caller ...
    assert modes.cli_json(mode, "--", "true")["exit_code"] == 0
    wait_until(lambda: not daemons(), what="the next start to kill them")  # ... until the next start


def test_the_sweep_spares_live_owners_and_foreign_names(tmp_path):
    from longhaul.sandbox import leftovers, procs

    me = procs.owner_token()
    ns = me.split(".")[2]
    live = tmp_path / f"longhaul-sbx-{me}-abc-x"
    dead = tmp_path / f"longhaul-sbx-{os.getpid()}.1.{ns}-abc-x"  # our pid, another start time: a reused pid
    foreign_ns = tmp_path / f"longhaul-sbx-{os.getpid()}.1.{int(ns) + 1}-abc-x"  # an owner we cannot see
    legacy = tmp_path / "longhaul-sbx-0123456789ab-x"  # no owner recorded
    for d in (live, dead, foreign_ns, legacy):
        (d / "work").mkdir(parents=True)
    leftovers.sweep(str(tmp_path))
    assert live.exists() and foreign_ns.exists() and legacy.exists() and not dead.exists()


def test_sigterm_to_the_cli_stops_and_removes_its_sandbox():
    cli = modes.popen_cli("cgroups", "--wall", "600", "--", "sleep", "4848.25")
    try:
        wait_until(lambda: sandboxed(cli.pid, "sleep"), what="the sandboxed sleep to start")
        root, _ = running_sandbox(cli.pid)
        cli.send_signal(signal.SIGTERM)
        cli.wait(timeout=120)
    finally:
        cli.kill()
    assert cli.returncode == 128 + signal.SIGTERM
    assert not host_pids("sleep 4848.25") and not root.exists()
