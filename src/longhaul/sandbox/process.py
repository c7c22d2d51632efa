"""Run a Python program in a child process with rlimits and a wall-clock watchdog."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

OUTPUT_CAP = 64 * 1024  # bytes kept per stream


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def _limits(mem_bytes: int, cpu_s: int):
    def apply():
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_python(source: str, timeout_s: float = 5.0, mem_bytes: int = 1 << 30) -> ExecResult:
    """Execute `source` with `python -I` in a fresh temp dir; kill its process group on timeout."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="longhaul-exec-") as tmp:
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=tmp, env=env, preexec_fn=_limits(mem_bytes, int(timeout_s) + 1),
        )
        timed_out = False
        try:
            out, err = proc.communicate(source.encode("utf-8", "replace"), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
        else:
            try:  # anything the program left running in its group goes too
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return ExecResult(
        exit_code=proc.returncode, stdout=out[:OUTPUT_CAP].decode("utf-8", "replace"),
        stderr=err[:OUTPUT_CAP].decode("utf-8", "replace"), timed_out=timed_out, wall_s=time.monotonic() - start,
    )


def run_many(sources: list[str], timeout_s: float = 5.0, workers: int = 2) -> list[ExecResult]:
    """Run programs concurrently (each in its own process); results in input order."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda s: run_python(s, timeout_s), sources))
