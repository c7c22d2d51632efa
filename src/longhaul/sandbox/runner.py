"""Spawn one command under limits, drain its output without ever blocking on a full pipe,
enforce the wall clock and the output cap, and say which limit (if any) stopped it.

The watchdog needs no cgroups: `Launch.stop` kills the whole tree by means the backend owns
(the pid namespace's init for bubblewrap). Which limit was hit is read only from facts the
program cannot forge: the watchdog's and the output cap's own records, the signal that ended
the command, cgroup counters, and a full workdir (or, where no tmpfs caps it, the runner's own
measurement of what it stores); never from what the program printed. A
command that exits 0 has no limit hit unless the runner itself stopped it.
"""

from __future__ import annotations

import functools
import os
import resource
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from longhaul.sandbox import procs
from longhaul.sandbox.spec import ExecResult, LimitHit, SandboxSpec
from longhaul.sandbox.storage import wait_s


@dataclass
class Launch:
    argv: list[str]
    env: dict | None
    cwd: str | None
    preexec: Callable[[], None] | None  # None: `argv` starts with `launcher_prefix` (the caller is never forked)
    stop: Callable[[subprocess.Popen], None]  # kills every process the command started; the caller reaps it
    after_exit: Callable[[int, bool], None]  # (main pid, reaped yet): kills what outlived the main process
    counters: Callable[[], dict] | None = None  # cgroup counters, read before and after
    wrapped: bool = False  # bwrap reports a signal death as exit code 128 + signal
    disk_full: Callable[[], bool] = lambda: False  # the workdir has no space or inodes left
    storage: Callable[[], object] | None = None  # a `storage.StorageWatch` for a workdir no tmpfs caps


@functools.lru_cache(maxsize=1)
def _launcher_tools() -> tuple[str, str, str] | None:
    tools = tuple(shutil.which(t, path="/usr/bin:/bin:/usr/sbin:/sbin") for t in ("sh", "prlimit", "setpriv"))
    return None if None in tools else tools


# joins each cgroup named before "--" (its own pid: v1 and v2 alike), then execs the rest
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'


def _rlimits(spec: SandboxSpec, uid: int | None, use_cgroup_limits: bool) -> list[tuple[str, int, int]]:
    """The rlimits a sandboxed command starts under, as (name, soft, hard); the name is both the
    `resource.RLIMIT_*` suffix and prlimit's option."""
    cpu = max(1, int(spec.cpu_s + 0.999))
    out = [("cpu", cpu, cpu + 1), ("fsize", spec.fsize_bytes, spec.fsize_bytes), ("nofile", spec.open_files, spec.open_files),
           ("core", 0, 0)]
    if not use_cgroup_limits:
        out.append(("as", spec.memory_bytes, spec.memory_bytes))
    if uid is not None:
        # the kernel ignores RLIMIT_NPROC for root, so it only holds once we are `uid`; with a
        # pids cgroup it is a backstop set above the cgroup, so the cgroup (which counts refusals) trips first
        nproc = spec.pids + 16 if use_cgroup_limits else spec.pids
        out.append(("nproc", nproc, nproc))
    return out


def launcher_prefix(spec: SandboxSpec, uid: int | None, use_cgroup_limits: bool, cgroup_procs: list[Path]) -> list[str] | None:
    """An argv prefix that does what `rlimit_preexec` does in small programs exec'd one after the
    other: sh joins the cgroup, util-linux's prlimit sets the rlimits, setpriv drops to the
    sandbox uid. With it the caller spawns without a preexec function, which Python does with
    vfork: a fork copies the page tables of all the caller's memory (a trainer's many GB), a cost
    that grows with it, and makes every page the caller writes afterwards fault once more. The
    caller starts a new session (`start_new_session`). None where a tool is missing."""
    tools = _launcher_tools()
    if tools is None:
        return None
    sh, prlimit, setpriv = tools
    out = [sh, "-c", _JOIN, "sh", *map(str, cgroup_procs), "--", prlimit]
    out += [f"--{name}={soft}:{hard}" for name, soft, hard in _rlimits(spec, uid, use_cgroup_limits)]
    out.append("--")
    if uid is not None:
        out += [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return out


def rlimit_preexec(spec: SandboxSpec, uid: int | None, use_cgroup_limits: bool, join: Callable[[], None] | None):
    """The child side, between fork and exec: join the cgroup, set rlimits, drop to the sandbox
    uid. Used where `launcher_prefix` cannot be."""
    limits = [(getattr(resource, f"RLIMIT_{name.upper()}"), soft, hard) for name, soft, hard in _rlimits(spec, uid, use_cgroup_limits)]

    def apply():
        os.setsid()
        if join:
            join()
        for which, soft, hard in limits:
            resource.setrlimit(which, (soft, hard))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    return apply


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def run(launch: Launch, spec: SandboxSpec, stdin: bytes | None, timeout: float) -> ExecResult:
    before = launch.counters() if launch.counters else {}
    start = time.monotonic()
    proc = subprocess.Popen(launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=launch.env, cwd=launch.cwd, preexec_fn=launch.preexec, close_fds=True,
                            start_new_session=launch.preexec is None)
    watch = launch.storage() if launch.storage else None
    try:
        bufs, truncated, hit = _drain(proc, launch, spec, stdin, start + timeout, watch)
    except BaseException:  # a signal to the caller (KeyboardInterrupt, SystemExit): leave nothing running
        launch.stop(proc)
        proc.wait()
        raise
    if hit:
        launch.stop(proc)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    launch.after_exit(proc.pid, True)
    for f in bufs:
        f.close()
    wall = time.monotonic() - start
    code = proc.returncode
    sig = -code if code < 0 else None
    if launch.wrapped and 128 < code <= 128 + 64:
        sig = code - 128
    exit_code = None if sig else code
    after = launch.counters() if launch.counters else {}
    # bwrap's own rusage misses processes reaped inside its pid namespace; the cgroup sees all
    cpu = (after["cpu_ns"] - before["cpu_ns"]) / 1e9 if "cpu_ns" in after else usage.ru_utime + usage.ru_stime
    peak = after.get("peak") or usage.ru_maxrss * 1024
    if hit is None and watch is not None and watch.over(force=True):
        hit = "fsize"  # stored past the cap between two samples: the runner's own measurement
    if hit is None:
        hit = classify(spec, exit_code, sig, cpu, before, after, launch.disk_full)
    return ExecResult(exit_code, sig, bytes(bufs[proc.stdout]).decode("utf-8", "replace"),
                      bytes(bufs[proc.stderr]).decode("utf-8", "replace"), truncated, hit, wall, cpu, peak)


def _drain(proc, launch: Launch, spec: SandboxSpec, stdin: bytes | None, deadline: float, watch=None):
    """Read both streams until they close or a limit is hit; returns (buffers, truncated, hit).
    When the main process exits, what it left running is killed, so a daemon holding the
    pipes open cannot keep the command going until the wall clock. `watch` (a
    `storage.StorageWatch`) stops the command once its workdir grows past the disk cap."""
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin or b""), daemon=True)
    feeder.start()
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    exited = procs.pidfd(proc.pid)
    if exited is not None:
        sel.register(exited, selectors.EVENT_READ)
    hit, truncated, streams = None, False, 2
    try:
        while streams:
            left = deadline - time.monotonic()
            if left <= 0:
                hit = "wall"
                break
            if watch is not None and watch.over():
                hit = "fsize"
                break
            for key, _ in sel.select(timeout=wait_s(watch, left, 0.5)):
                if key.fileobj == exited:
                    sel.unregister(exited)
                    launch.after_exit(proc.pid, False)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    streams -= 1
                    continue
                buf = bufs[key.fileobj]
                room = spec.output_bytes - len(buf)
                buf += chunk[:max(0, room)]
                if len(chunk) > room:
                    truncated = True
            if truncated:
                hit = "output"
                break
    finally:
        sel.close()
        if exited is not None:
            os.close(exited)
    return bufs, truncated, hit


def classify(spec: SandboxSpec, exit_code: int | None, sig: int | None, cpu: float, before: dict, after: dict,
             disk_full: Callable[[], bool] = lambda: False) -> LimitHit | None:
    """The limit that ended a command the runner did not stop itself, from kernel facts only."""
    if exit_code == 0:
        return None
    if after.get("oom_kill", 0) > before.get("oom_kill", 0):
        return "memory"
    if after.get("pids_max", 0) > before.get("pids_max", 0):
        return "pids"
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= spec.cpu_s * 0.95):
        return "cpu"
    if sig == signal.SIGXFSZ or disk_full():
        return "fsize"
    if sig == signal.SIGKILL and after.get("mem_fail", 0) > before.get("mem_fail", 0):
        return "memory"
    return None
