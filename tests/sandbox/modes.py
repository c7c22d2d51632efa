"""Run longhaul in a child process as the sandbox meets it in the field: with cgroups, with
cgroups hidden (a private mount namespace with an empty tmpfs over /sys/fs/cgroup, so the
sandbox's own detection finds none), and as an unprivileged user (uid 65534 through setpriv).
Each mode is a command prefix; a mode this machine cannot provide is skipped with the reason.
Also what the tests read about host processes, from /proc, independently of the code under test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
MODES = ("cgroups", "no-cgroups", "unprivileged")
NOBODY = 65534
HIDE_CGROUPS = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none /sys/fs/cgroup && exec "$@"', "-"]


def _python_and_path(mode: str) -> tuple[str, str]:
    site = [p for p in sys.path if p.endswith("site-packages")]
    if mode != "unprivileged" or os.geteuid() != 0:
        return sys.executable, os.pathsep.join([str(SRC), *site])
    from longhaul.sandbox.bwrap import expose

    # the interpreter may sit under a private home (/root/.pyenv): the sandbox's own read-only exposure reaches it
    py = Path(expose(sys.base_prefix)) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(py), os.pathsep.join([str(SRC), *site])


_PREFIXES: dict[str, list[str]] = {}


def prefix(mode: str) -> list[str]:
    if mode not in _PREFIXES:
        _PREFIXES[mode] = _probe(mode)
    return _PREFIXES[mode]


def _probe(mode: str) -> list[str]:
    if mode == "cgroups":
        return []
    if mode == "no-cgroups":
        if os.geteuid() != 0:
            return []  # an unprivileged user cannot write cgroups: already the case under test
        if shutil.which("unshare") is None or subprocess.run([*HIDE_CGROUPS, "true"], capture_output=True).returncode != 0:
            pytest.skip("cannot hide cgroups: unshare(1) or a private mount namespace is unavailable")
        return HIDE_CGROUPS
    if os.geteuid() != 0:
        return []  # already unprivileged
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv(1) is not installed: cannot run as an unprivileged user")
    pre = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    probe = subprocess.run([*pre, "bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"an unprivileged user cannot run bubblewrap here (no user namespaces?): {probe.stderr.strip()}")
    py, path = _python_and_path(mode)
    probe = subprocess.run([*pre, py, "-c", "import longhaul.cli"], capture_output=True, text=True, env=env(mode))
    if probe.returncode != 0:
        pytest.skip(f"uid {NOBODY} cannot import longhaul from {SRC}: {probe.stderr.strip()[-200:]}")
    return pre


def env(mode: str) -> dict:
    _, path = _python_and_path(mode)
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": path, "LANG": "C.UTF-8", "LONGHAUL_MALLOC": "system"}
    e["HOME"] = "/tmp" if mode == "unprivileged" else os.environ.get("HOME", "/tmp")
    return e


def command(mode: str, argv: list[str]) -> list[str]:
    """`argv` (starting with "python") as mode `mode` runs it."""
    py, _ = _python_and_path(mode)
    return [*prefix(mode), *[py if a == "python" else a for a in argv]]


def popen_cli(mode: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(command(mode, ["python", "-m", "longhaul.cli", "sandbox", "run", *args]), env=env(mode),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def cli(mode: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`longhaul sandbox run ARGS` in mode `mode`; the timeout only bounds a hang."""
    return subprocess.run(command(mode, ["python", "-m", "longhaul.cli", "sandbox", "run", *args]), env=env(mode),
                          capture_output=True, text=True, timeout=timeout)


def cli_json(mode: str, *args: str, timeout: float = 120) -> dict:
    r = cli(mode, "--json", *args, timeout=timeout)
    assert r.stdout.strip(), r.stderr
    return json.loads(r.stdout)


def script(mode: str, code: str, timeout: float = 300) -> dict:
    """Run Python `code` in mode `mode`; it prints one JSON object last, which is returned."""
    r = subprocess.run(command(mode, ["python", "-c", code]), env=env(mode), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- observing the host ------------------------------------------------------------------

def host_pids(text: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]


def running(*argv: str) -> list[int]:
    """Processes whose command line is exactly `argv` (pgrep -f also matches callers naming it)."""
    want, out = "\0".join(argv).encode() + b"\0", []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and Path(f"/proc/{p}/cmdline").read_bytes() == want:
                out.append(int(p))
        except OSError:
            pass
    return out


def children(pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                out.append(int(p))
        except (OSError, IndexError):
            pass
    return out


def sandboxed(caller: int, comm: str) -> list[int]:
    """Processes named `comm` below `caller` (pgrep -f would also match the caller's own argv)."""
    out, todo = [], children(caller)
    while todo:
        pid = todo.pop()
        todo += children(pid)
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                out.append(pid)
        except OSError:
            pass
    return out


def running_sandbox(caller: int) -> tuple[Path, list[str]]:
    """The root directory and the cgroups (as /proc/PID/cgroup names them) of the sandbox a caller
    is running, read from its bubblewrap process."""
    bwrap = next(p for p in children(caller) if Path(f"/proc/{p}/exe").resolve().name == "bwrap")
    argv = Path(f"/proc/{bwrap}/cmdline").read_bytes().split(b"\0")
    cgroups = [line.split(":", 2)[2] for line in Path(f"/proc/{bwrap}/cgroup").read_text().splitlines() if "longhaul-" in line]
    return Path(argv[argv.index(b"/work") - 1].decode()).parent, cgroups
