"""One queued run's process on its node: `longhaul train CONFIG --resume` as a child of a Ray
actor that lives in the run's placement group.

The actor is detached and named after the run (`longhaul-run-<id>`), so it outlives a restart
of the queue service, which finds it again by name; a second actor of the same name cannot
exist, so a run cannot start twice. The child is started in the actor's constructor and dies
with the actor's process (PR_SET_PDEATHSIG), so a lost node or a killed actor leaves no
training process behind. `stop(grace_s)` is the pre-emption: SIGTERM (the run finishes its
step, saves and exits 143), then SIGKILL after `grace_s`.

Ray is imported by the caller (`service.py`), which wraps `RunProcess` with `ray.remote`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

ACTOR_PREFIX = "longhaul-run-"
NAMESPACE = "longhaul"  # the Ray namespace of the queue's actors
SERVICE_NAME = "longhaul-queue"  # the queue service's actor
STOPPED = 128 + signal.SIGTERM  # `longhaul train`'s exit after saving on a stop notice


def run_argv(config_path: Path, overrides: list[str], run_root: Path) -> list[str]:
    """The command a queued run executes: always `--resume` (a first start has no checkpoint and
    starts afresh), its outputs under `run_root`."""
    return [sys.executable, "-m", "longhaul.cli", "train", str(config_path), *overrides, f"output_dir={run_root}", "--resume"]


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)


class RunProcess:
    """The actor body: runs `argv` in `workdir`, its output appended to `log_path`."""

    def __init__(self, run_id: str, argv: list[str], workdir: str, log_path: str, env: dict | None = None):
        self.run_id = run_id
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._stopping = False
        self._lock = threading.Lock()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent)

    def info(self) -> dict:
        import ray

        return {"run": self.run_id, "pid": self.proc.pid, "node": ray.get_runtime_context().get_node_id()}

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.proc.poll()

    def stop(self, grace_s: float) -> int:
        """SIGTERM, wait up to `grace_s` for the save and exit, then SIGKILL; the exit status."""
        with self._lock:
            if self.proc.poll() is None and not self._stopping:
                self._stopping = True
                self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def tail(self, chars: int = 2000) -> str:
        """The end of the run's output."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - chars))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def last_error(tail: str) -> str:
    """The line of a run's output that says why it failed (`error: ...`), else its last line."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("error:") or ln.endswith("Error") or "Error:" in ln]
    return (said or lines or ["(no output)"])[-1][:300]
