"""What a killed caller leaves behind, and its removal on a later start.

A caller killed with SIGKILL runs no cleanup: its sandboxes' processes die with it (bubblewrap's
parent-death signal, then the pid namespace), but their root directories (with the workdir
tmpfs still mounted) and cgroup directories stay. Each carries its owner's `pid.start-time` in
its name; `sweep` removes those whose owner is dead, and never one whose owner lives or whose
name does not say (directories of older versions, another user's). Processes of the `process`
backend have no namespace to die with: a dead holder's uid claim (root) or cgroup names them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from longhaul.sandbox import cgroup, procs, uids

PREFIX = "longhaul-sbx-"
EVERY_S = 60.0  # a long-lived caller (a server) sweeps again after this long

_last = [-EVERY_S]
_lock = threading.Lock()


def root_prefix(sandbox_id: str) -> str:
    """The prefix of a new sandbox's root directory: it names this process as the owner."""
    return f"{PREFIX}{procs.owner_token()}-{sandbox_id}-"


def _mounts_under(root: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    base = str(root) + "/"
    return sorted((p for p in points if p.startswith(base)), reverse=True)  # innermost first


def remove_root(root: Path) -> None:
    """Unmount whatever is mounted below a sandbox root (the workdir tmpfs), then delete it."""
    if os.geteuid() == 0:
        for mp in _mounts_under(root):
            subprocess.run(["umount", "-l", mp], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def sweep(tmp: str | None = None) -> None:
    """Remove the leftovers of every sandbox whose owner process is dead."""
    base = Path(tmp or tempfile.gettempdir())
    me = os.geteuid()
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(PREFIX)]
    except OSError:
        entries = []
    for e in entries:
        owner = e.name[len(PREFIX):].split("-")[0]
        if "." not in owner or procs.owner_alive(owner):  # no owner recorded (an older version), or alive
            continue
        try:
            if not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != me:
                continue
        except OSError:
            continue
        remove_root(Path(e.path))
    cgroup.sweep()
    if me == 0:
        uids.sweep_stale()


def sweep_now_and_then() -> None:
    """`sweep` on a process's first sandbox and then at most every EVERY_S seconds."""
    with _lock:
        now = time.monotonic()
        if now - _last[0] < EVERY_S:
            return
        _last[0] = now
    try:
        sweep()
    except OSError:  # a leftover we cannot remove must not stop a new sandbox
        pass
