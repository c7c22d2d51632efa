"""The fast path for code checks: one Python interpreter started inside a sandbox that forks
per check, so a HumanEval-sized check costs a fork, not an interpreter start-up.

Each check runs in a fresh forked child (own process group, CPU rlimit, alarm for the wall
clock, output to private files capped by RLIMIT_FSIZE), so checks do not see each other's
state. The server itself is untrusted-code-adjacent: it runs in the sandbox, under its cgroup.
A check's limit is read from its wait status and the cgroup's counters, never from its output;
a check that exits 0 has none.
"""

from __future__ import annotations

import json
import os
import signal as sg
import struct
import subprocess
import threading
import time

from longhaul.sandbox.sandbox import Sandbox
from longhaul.sandbox.spec import ExecResult, SandboxSpec

SERVER = r'''
import json, os, resource, signal, struct, sys, time
inp, out = sys.stdin.buffer, sys.stdout.buffer
n = 0
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    req = json.loads(inp.read(struct.unpack(">I", head)[0]))
    n += 1
    paths = ("/tmp/.o%d" % n, "/tmp/.e%d" % n)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        for fd, p in zip((1, 2), paths):
            f = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
        nul = os.open("/dev/null", os.O_RDONLY)
        os.dup2(nul, 0)
        cpu = max(1, int(req["cpu"] + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        signal.alarm(max(1, int(req["timeout"] + 0.999)))
        code = 0
        try:
            exec(compile(req["code"], "<check>", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    _, status, ru = os.wait4(pid, 0)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    cap = req["cap"]
    outs = []
    for p in paths:
        try:
            with open(p, "rb") as f:
                data = f.read(cap + 1)
            os.unlink(p)
        except OSError:
            data = b""
        outs.append(data)
    res = {"status": status, "wall": time.monotonic() - t0,
           "cpu": ru.ru_utime + ru.ru_stime, "rss": ru.ru_maxrss * 1024,
           "out": outs[0][:cap].decode("utf-8", "replace"), "err": outs[1][:cap].decode("utf-8", "replace"),
           "trunc": any(len(o) > cap for o in outs)}
    b = json.dumps(res).encode()
    out.write(struct.pack(">I", len(b)) + b)
    out.flush()
'''


class PythonChecker:
    """Run Python programs (a solution plus its tests) through a forking server in a sandbox."""

    def __init__(self, spec: SandboxSpec | None = None, backend: str | None = None, audit=None):
        self.sandbox = Sandbox(spec, backend, audit)
        self._lock = threading.Lock()
        self._proc = None
        self._timed_out = False  # set by the read timer when it kills the server
        self._start()

    def _start(self) -> None:
        # RLIMIT_CPU counts the server's own time only (each forked check has its own counter);
        # a server that ever runs out is simply restarted by `check`
        self._proc = subprocess.Popen(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      **self.sandbox.spawn_args(["python3", "-I", "-c", SERVER]))

    def check(self, code: str, timeout: float = 5.0) -> ExecResult:
        cpu = min(timeout, self.sandbox.spec.cpu_s)
        req = json.dumps({"code": code, "timeout": timeout, "cpu": cpu,
                          "cap": self.sandbox.spec.output_bytes}).encode()
        started = time.time()
        with self._lock:
            t0 = time.monotonic()
            before = self.sandbox.cgroup.counters() if self.sandbox.cgroup else {}
            self._timed_out = False
            try:
                self._proc.stdin.write(struct.pack(">I", len(req)) + req)
                self._proc.stdin.flush()
                head = self._read(4, timeout + 5)
                res = json.loads(self._read(struct.unpack(">I", head)[0], 5))
            except (OSError, TimeoutError, struct.error, ValueError):
                self._restart()  # the server died (OOM, pids) or hung: start a fresh one
                after = self.sandbox.cgroup.counters() if self.sandbox.cgroup else {}
                hit = _lost(before, after, self._timed_out)
                return ExecResult(None, 9, "", "check server lost\n", False, hit, time.monotonic() - t0, 0.0, 0)
        after = self.sandbox.cgroup.counters() if self.sandbox.cgroup else {}
        result = _result(res, cpu, before, after)
        self.sandbox.audit.record(self.sandbox.id, ["python-check"], self.sandbox.spec.limits(), code.encode(), result, started)
        return result

    def _read(self, n: int, timeout: float) -> bytes:
        out, proc = self._proc.stdout, self._proc

        def expire():
            self._timed_out = True
            self.sandbox.kill_tree(proc)
        timer = threading.Timer(timeout, expire)
        timer.start()
        try:
            data = out.read(n)
        finally:
            timer.cancel()
        if len(data) < n:
            raise TimeoutError("check server closed its output")
        return data

    def _restart(self) -> None:
        self.sandbox.kill_tree(self._proc)
        self._proc.wait()
        self._start()

    def close(self) -> None:
        if self._proc is not None:
            self.sandbox.kill_tree(self._proc)
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            self._proc = None
        self.sandbox.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _lost(before: dict, after: dict, timed_out: bool) -> str | None:
    """Why the server died under a check: the OOM killer, our own timer, a refused fork, or unknown."""
    if after.get("oom_kill", 0) > before.get("oom_kill", 0):
        return "memory"
    if timed_out:
        return "wall"
    if after.get("pids_max", 0) > before.get("pids_max", 0):
        return "pids"
    return None


def _result(res: dict, cpu_s: float, before: dict, after: dict) -> ExecResult:
    status = res["status"]
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    hit = None
    if code == 0:
        pass
    elif after.get("oom_kill", 0) > before.get("oom_kill", 0):
        hit = "memory"
    elif sig == sg.SIGALRM:  # the server's alarm: its wall clock
        hit = "wall"
    elif sig == sg.SIGXCPU or (sig == sg.SIGKILL and res["cpu"] >= 0.9 * cpu_s):
        hit = "cpu"
    elif after.get("pids_max", 0) > before.get("pids_max", 0):
        hit = "pids"
    elif sig == sg.SIGXFSZ:
        hit = "fsize"
    return ExecResult(None if sig else code, sig, res["out"], res["err"], res["trunc"], hit, res["wall"], res["cpu"], res["rss"])


class CheckerPool:
    """N check servers (one sandbox each) used from N threads: `run_many` keeps input order."""

    def __init__(self, n: int, spec: SandboxSpec | None = None, backend: str | None = None, audit=None):
        self.checkers = [PythonChecker(spec, backend, audit) for _ in range(max(1, n))]

    def run_many(self, programs: list[str], timeout: float = 5.0) -> list[ExecResult]:
        from concurrent.futures import ThreadPoolExecutor

        if not programs:
            return []
        k = len(self.checkers)
        out: list[ExecResult | None] = [None] * len(programs)

        def worker(j: int) -> None:
            for i in range(j, len(programs), k):
                out[i] = self.checkers[j].check(programs[i], timeout)
        with ThreadPoolExecutor(max_workers=k) as ex:
            list(ex.map(worker, range(k)))
        return out  # type: ignore[return-value]

    def close(self) -> None:
        for c in self.checkers:
            c.close()


_SHARED: dict[int, CheckerPool] = {}


def shared_pool(n: int) -> CheckerPool:
    """A process-wide pool of `n` check servers, started on first use and closed at exit."""
    if n not in _SHARED:
        import atexit

        _SHARED[n] = CheckerPool(n, SandboxSpec(wall_s=30, cpu_s=10, memory_bytes=512 << 20, pids=32))
        atexit.register(_SHARED[n].close)
    return _SHARED[n]
