"""A persistent shell in a sandbox: `run` keeps the working directory and environment between
commands, `interrupt` stops what is running without losing the shell, `close` ends it all."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid

from longhaul.sandbox import procs
from longhaul.sandbox.spec import ExecResult
from longhaul.sandbox.storage import wait_s


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class Session:
    def __init__(self, sandbox):
        self.sandbox = sandbox
        self._marker = f"__longhaul_{uuid.uuid4().hex}__"
        self._cond = threading.Condition()
        self._bufs = {"out": bytearray(), "err": bytearray()}
        self._closed = False
        self._eof = 0  # streams that reached end of file: the shell has exited
        self._proc = subprocess.Popen(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      **sandbox.spawn_args(["bash", "--noprofile", "--norc"]))
        self._pumps = [threading.Thread(target=self._pump, args=(key, stream), daemon=True)
                       for key, stream in (("out", self._proc.stdout), ("err", self._proc.stderr))]
        for t in self._pumps:
            t.start()

    def _pump(self, key: str, stream) -> None:
        cap = self.sandbox.spec.output_bytes * 2
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            with self._cond:
                if chunk:
                    buf = self._bufs[key]
                    buf += chunk
                    if len(buf) > cap:  # keep the tail, where the marker will be
                        del buf[: len(buf) - cap]
                self._cond.notify_all()
            if not chunk:
                with self._cond:
                    self._eof += 1
                    self._cond.notify_all()
                return

    def _shell_pid(self) -> int | None:
        for pid in procs.descendants(self._proc.pid):
            if _comm(pid) == "bash":
                return pid
        return None

    def interrupt(self) -> None:
        """Kill whatever the shell is running; the shell and its state stay."""
        shell = self._shell_pid()
        if shell is None:
            return
        for pid in reversed(procs.descendants(shell)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def run(self, command: str, timeout: float | None = None) -> ExecResult:
        if self._closed or self._proc.poll() is not None:
            raise RuntimeError("session is closed")
        timeout = timeout or self.sandbox.spec.wall_s
        m = self._marker
        # The command reaches the shell as one quoted word for `eval`: its text is parsed apart
        # from the marker lines, so an unterminated quote or block is a syntax error (status 2,
        # at once) instead of swallowing the marker and leaving the shell waiting for more input.
        quoted = "'" + command.replace("'", "'\\''") + "'"
        script = f"eval {quoted} < /dev/null\n__lh_rc=$?; printf '\\n{m}:%d\\n' $__lh_rc; printf '\\n{m}\\n' >&2\n"
        started = time.time()
        start = time.monotonic()
        with self._cond:
            self._bufs["out"].clear()
            self._bufs["err"].clear()
        self._proc.stdin.write(script.encode())
        self._proc.stdin.flush()
        hit = None
        end = m.encode()
        done = lambda: (end + b":" in self._bufs["out"] and b"\n" + end + b"\n" in self._bufs["err"]) or self._eof == 2
        watch = self.sandbox.storage_watch()  # where no tmpfs caps the workdir
        deadline = start + timeout
        while True:
            left = deadline - time.monotonic()
            with self._cond:
                if self._cond.wait_for(done, timeout=wait_s(watch, left, left)):
                    break
            if time.monotonic() >= deadline:
                hit = "wall"
                break
            if watch is not None and watch.over():
                hit = "fsize"
                break
        if hit:
            self.interrupt()
            with self._cond:
                self._cond.wait_for(done, timeout=5)
        elif watch is not None and watch.over(force=True):
            hit = "fsize"  # stored past the cap between two samples
        with self._cond:
            out, err = bytes(self._bufs["out"]), bytes(self._bufs["err"])
        head, sep, tail = out.rpartition(b"\n" + end + b":")
        code = int(tail.split(b"\n")[0] or -1) if sep else None  # no marker: rpartition puts all of out in tail
        if not sep and self._eof == 2:  # the shell exited (`exit`, or killed) before the marker: its status is the command's
            head, code = out, self._proc.wait(timeout=5)
        err_head, err_sep, _ = err.rpartition(b"\n" + end + b"\n")
        err = err_head if err_sep else err
        cap = self.sandbox.spec.output_bytes
        truncated = len(head) > cap or len(err) > cap
        sig = code - 128 if code and code > 128 else None
        res = ExecResult(None if sig else code, sig, head[:cap].decode("utf-8", "replace"), err[:cap].decode("utf-8", "replace"),
                         truncated, hit, time.monotonic() - start, 0.0, 0)  # output over the cap is cut, not stopped
        sb = self.sandbox
        sb.audit.record(sb.id, ["session", command], sb.spec.limits(), None, res, started, episode=sb.episode)
        return res

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.sandbox.kill_tree(self._proc)
        self._proc.wait()
        # The pumps end at EOF, once every process holding the pipes is gone. Closing a stream a
        # pump is still reading would block on its lock, so stragglers are killed first.
        for t in self._pumps:
            t.join(timeout=0.2)
        if any(t.is_alive() for t in self._pumps) and self.sandbox.cgroup:
            self.sandbox.cgroup.kill_all()
            for t in self._pumps:
                t.join(timeout=2.0)
        streams = [self._proc.stdin] + ([self._proc.stdout, self._proc.stderr] if not any(t.is_alive() for t in self._pumps) else [])
        for f in streams:
            try:
                f.close()
            except OSError:
                pass
