"""`Sandbox`: one isolated workdir and the commands run in it.

Backends: `bwrap` (namespaces, read-only root, size-capped writable mounts, cgroup limits,
an unprivileged uid) and `process` (rlimits only, for machines without bubblewrap; it is not
an isolation boundary and says so). The file API resolves every path beneath the workdir and
refuses symlinks that leave it. `close()` is idempotent and leaves no process behind.

As root each sandbox gets a host uid of its own (`UidClaim`) and its workdir is a tmpfs of
`disk_bytes` mounted on the host; as another user the workdir is a plain host directory, whose
total the runner samples while a command runs (`storage`), stopping the command once it has
grown past `disk_bytes`; `fsize_bytes` bounds each file. Processes are stopped through the pid
namespace (bwrap) or the process group and uid (process), with cgroups where writable and
without them where not.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
import warnings
from pathlib import Path

from longhaul.errors import LonghaulError
from longhaul.sandbox import bwrap as bw
from longhaul.sandbox import leftovers, procs
from longhaul.sandbox.audit import AuditLog
from longhaul.sandbox.cgroup import CGroup
from longhaul.sandbox.runner import Launch, launcher_prefix, rlimit_preexec, run
from longhaul.sandbox.session import Session
from longhaul.sandbox.spec import ExecResult, SandboxSpec
from longhaul.sandbox.storage import StorageWatch
from longhaul.sandbox.uids import UidClaim


class SandboxError(LonghaulError):
    pass


def _require_regular(fd: int, path: str) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise SandboxError(f"{path!r} is not a regular file (a fifo, socket or device); only regular files are read or written")


def _copy_regular(src: str, dst: str) -> None:
    """copytree's file copier: regular files only, so a fifo planted in /work cannot hang a snapshot."""
    if stat.S_ISREG(os.lstat(src).st_mode):
        shutil.copy2(src, dst)


def default_backend() -> str:
    if shutil.which("bwrap"):
        return "bwrap"
    warnings.warn("bubblewrap not found (apt-get install bubblewrap): sandboxes fall back to the `process` backend, "
                  "which applies rlimits but does NOT isolate", RuntimeWarning, stacklevel=2)
    return "process"


class Sandbox:
    def __init__(self, spec: SandboxSpec | None = None, backend: str | None = None, audit: AuditLog | str | None = None,
                 episode: str | None = None):
        self.spec = spec or SandboxSpec()
        self.backend = backend or default_backend()
        if self.backend not in ("bwrap", "process"):
            raise SandboxError(f"unknown sandbox backend {self.backend!r}; choose 'bwrap' or 'process'")
        if self.backend == "bwrap":
            bw.bwrap_path()
        self.id = uuid.uuid4().hex[:12]
        self.audit = audit if isinstance(audit, AuditLog) else AuditLog(audit)
        self.episode = episode  # the sandbox whose episode this one serves (its audit rows say so)
        self._closed = True  # until the root exists, close() has nothing to undo
        self._claim, self.uid, self.cgroup, self._mounted = None, None, None, False
        self._snapshots: dict[str, Path] = {}
        self._sessions: list = []
        leftovers.sweep_now_and_then()
        self._claim = UidClaim.acquire() if os.geteuid() == 0 else None
        try:
            self.root = Path(tempfile.mkdtemp(prefix=leftovers.root_prefix(self.id)))
        except BaseException:
            if self._claim:
                self._claim.release()
            raise
        self._closed = False
        self.uid = self._claim.uid if self._claim else None
        self.workdir = self.root / "work"
        self.workdir.mkdir()
        if self.uid is not None:
            self._mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.spec.disk_bytes},mode=0755,nosuid,nodev",
                                            "tmpfs", str(self.workdir)], capture_output=True).returncode == 0
            if not self._mounted:
                warnings.warn(f"could not mount a tmpfs on {self.workdir}: the workdir's size is not capped "
                              f"(only each file, by fsize_bytes)", RuntimeWarning, stacklevel=2)
            os.chown(self.workdir, self.uid, self.uid)
            os.chmod(self.root, 0o755)
        self.etc = bw.write_etc(self.root)
        self.cgroup = CGroup.create(self.spec.memory_bytes, self.spec.pids)

    # ---- commands -------------------------------------------------------------------
    def spawn_args(self, argv: list[str], cwd: str | None = None) -> dict:
        """Popen keyword arguments that start `argv` inside this sandbox under its limits:
        every process a sandbox runs (exec, session shell, check server) starts through here."""
        cg = self.cgroup
        prefix = launcher_prefix(self.spec, self.uid, cg is not None, cg.procs_files() if cg else [])
        how = ({"preexec_fn": None, "start_new_session": True} if prefix is not None else
               {"preexec_fn": rlimit_preexec(self.spec, self.uid, cg is not None, cg.add_self if cg else None),
                "start_new_session": False})
        if self.backend == "bwrap":
            full = bw.bwrap_argv(self.spec, self.workdir, self.etc, argv, cwd or "/work")
            return {"args": (prefix or []) + full, "env": {"PATH": "/usr/bin:/bin"}, "cwd": None, **how}
        env = {**bw.sandbox_env(self.spec, bw.expose(self.spec.python)), "HOME": str(self.workdir)}
        work = str(self.workdir / cwd.removeprefix("/work").lstrip("/")) if cwd else str(self.workdir)
        return {"args": (prefix or []) + argv, "env": env, "cwd": work, **how}

    def kill_tree(self, proc: subprocess.Popen) -> None:
        """Kill every process that `proc` (started from `spawn_args`) started, then `proc`; the caller reaps `proc`.
        bwrap: kill the sandbox's pid 1, so the kernel kills the rest of its namespace, and let
        bubblewrap reap it and exit (killing bubblewrap first would orphan pid 1 as a zombie).
        process: stop and kill the process tree and group, then what runs as the sandbox's uid."""
        if proc.returncode is not None:  # reaped already: its pid may name another process by now
            self._after_exit(proc.pid, reaped=True)
            return
        if self.backend == "bwrap":
            if procs.wait_exit(proc.pid, 0):  # bubblewrap exits only once its pid 1, and so its namespace, is gone
                pass
            elif (init := procs.ns_init(proc.pid)) is not None:
                procs.kill_child_of(proc.pid, init)
                if not procs.wait_exit(proc.pid, 5.0):
                    procs.kill_pids([proc.pid])
            else:  # still setting up: its child, if cloned as it dies, is found by its uid
                procs.kill_pids([proc.pid])
                procs.wait_exit(proc.pid, 5.0)
                if self.uid is not None:
                    procs.reap(p for p in procs.kill_uid(self.uid) if p != proc.pid)
        else:
            tree = [proc.pid, *procs.descendants(proc.pid)]
            for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first: none acts on another's death
                procs.kill_pids(tree, sig)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            procs.reap(tree[1:])
        self._after_exit(proc.pid, reaped=False)

    def _after_exit(self, main: int, reaped: bool = True) -> None:
        """Kill what a command left running once its main process `main` has exited."""
        killed = []
        if self.backend == "process":
            if not reaped:  # until `main` is reaped its pid, and so its group's, cannot be reused
                try:
                    os.killpg(main, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if self.uid is not None:
                killed += procs.kill_uid(self.uid)
        if self.cgroup:
            killed += self.cgroup.kill_all()
        procs.reap(p for p in killed if p != main)

    def disk_full(self) -> bool:
        """Whether the workdir tmpfs has no space or no inodes left: a kernel fact, unlike the text
        a program prints about it."""
        if not self._mounted:
            return False
        st = os.statvfs(self.workdir)
        return st.f_bavail == 0 or st.f_favail == 0

    def _launch(self, argv: list[str], cwd: str | None) -> Launch:
        a = self.spawn_args(argv, cwd)
        cg = self.cgroup
        return Launch(a["args"], a["env"], a["cwd"], a["preexec_fn"], self.kill_tree, self._after_exit,
                      cg.counters if cg else None, wrapped=self.backend == "bwrap", disk_full=self.disk_full,
                      storage=self.storage_watch)

    def storage_watch(self) -> StorageWatch | None:
        """A watch on what the workdir stores, where no tmpfs caps it (None where one does)."""
        return None if self._mounted else StorageWatch(self.workdir, self.spec.disk_bytes)

    def _refuse(self, argv: list[str]) -> str | None:
        allow = self.spec.allow_commands
        if allow is None:
            return None
        name = os.path.basename(argv[0]) if argv else ""
        return None if name in allow else f"longhaul sandbox: command {name!r} is not allowed here (allowed: {', '.join(allow)})\n"

    def exec(self, argv: list[str], stdin: bytes | str | None = None, timeout: float | None = None, cwd: str | None = None) -> ExecResult:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed; open a new one")
        if not argv:
            raise SandboxError("exec needs a non-empty argv")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        started = time.time()
        refusal = self._refuse(argv)
        if refusal:
            res = ExecResult(126, None, "", refusal, False, None, 0.0, 0.0, 0)
            self.audit.record(self.id, argv, self.spec.limits(), data, res, started, refused="command not allowed",
                              episode=self.episode)
            return res
        if self.cgroup:
            self.cgroup.reset_peak()
        res = run(self._launch(list(argv), cwd), self.spec, data, timeout or self.spec.wall_s)
        self.audit.record(self.id, list(argv), self.spec.limits(), data, res, started, episode=self.episode)
        return res

    # ---- files ----------------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        """A sandbox path (`/work/a`, or relative to it) as a host path beneath the workdir."""
        rel = path.removeprefix("/work").lstrip("/") if path.startswith("/work") else path
        if os.path.isabs(rel):
            raise SandboxError(f"path {path!r} is outside the workdir /work")
        host = (self.workdir / rel)
        real = Path(os.path.realpath(host))
        base = Path(os.path.realpath(self.workdir))
        if real != base and base not in real.parents:
            raise SandboxError(f"path {path!r} leaves the workdir (through '..' or a symlink)")
        return host

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        host = self.resolve(path)
        missing = [d for d in [host.parent, *host.parent.parents] if not d.exists() and self.workdir in d.parents]
        host.parent.mkdir(parents=True, exist_ok=True)
        if self.uid is not None:  # new directories belong to the sandbox user, or it could not change them
            for d in missing:
                os.lchown(d, self.uid, self.uid)
        raw = data.encode() if isinstance(data, str) else data
        if len(raw) > self.spec.fsize_bytes:
            raise SandboxError(f"write of {len(raw)} bytes to {path!r} is over the file size limit {self.spec.fsize_bytes}")
        fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
        with os.fdopen(fd, "wb") as f:
            _require_regular(fd, path)
            f.truncate(0)
            f.write(raw)
        if self.uid is not None:
            os.chown(host, self.uid, self.uid)

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        host = self.resolve(path)
        fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            _require_regular(fd, path)
            return f.read(limit if limit is not None else self.spec.output_bytes)

    # ---- state ----------------------------------------------------------------------
    def snapshot(self) -> str:
        token = uuid.uuid4().hex[:8]
        dst = self.root / "snapshots" / token
        shutil.copytree(self.workdir, dst, symlinks=True, copy_function=_copy_regular)
        self._snapshots[token] = dst
        return token

    def restore(self, token: str) -> None:
        src = self._snapshots.get(token)
        if src is None:
            raise SandboxError(f"no snapshot {token!r} in sandbox {self.id}")
        for child in self.workdir.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        self.import_tree(src)

    def import_tree(self, src: str | Path) -> None:
        """Copy a host directory into the workdir (links copied as links, never followed), owned by
        this sandbox's uid: how a fresh sandbox receives another one's files."""
        shutil.copytree(src, self.workdir, symlinks=True, dirs_exist_ok=True, copy_function=_copy_regular)
        if self.uid is not None:
            for dirpath, dirnames, filenames in os.walk(self.workdir):
                for name in [*dirnames, *filenames]:
                    os.lchown(os.path.join(dirpath, name), self.uid, self.uid)

    def state_digest(self, paths: list[str] | None = None) -> str:
        """sha256 over (relative path, type, content) of the given paths or the whole workdir; links are not followed."""
        h = hashlib.sha256()
        roots = [self.resolve(p) for p in paths] if paths else [self.workdir]
        for root in roots:
            items = [root]
            if root.is_dir() and not root.is_symlink():
                items = []
                for dirpath, dirnames, filenames in os.walk(root):  # never follows links
                    dirnames.sort()
                    items += [Path(dirpath) / n for n in sorted(dirnames + filenames)]
            for p in items:
                rel = str(p.relative_to(self.workdir))
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode):
                    h.update(f"L {rel} -> {os.readlink(p)}\n".encode())
                elif stat.S_ISREG(st.st_mode):
                    h.update(f"F {rel}\n".encode() + p.read_bytes())
                elif stat.S_ISDIR(st.st_mode):
                    h.update(f"D {rel}\n".encode())
                else:  # fifos, sockets, devices: their type, never their (blocking) content
                    h.update(f"S {rel} {stat.S_IFMT(st.st_mode)}\n".encode())
        return h.hexdigest()

    # ---- sessions and lifetime ------------------------------------------------------
    def open_session(self):

        s = Session(self)
        self._sessions.append(s)
        return s

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for s in self._sessions:
            s.close()
        if self.cgroup:
            self.cgroup.remove()
        if self.backend == "process" and self.uid is not None:
            procs.reap(procs.kill_uid(self.uid))
        if self._mounted:
            subprocess.run(["umount", "-l", str(self.workdir)], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if self._claim:
            self._claim.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
