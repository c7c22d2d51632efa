"""The bubblewrap command line for one sandbox: new user, pid, net, ipc, uts, mount and
cgroup namespaces; system paths read-only; a private workdir; nothing of the host's home,
secrets or environment.

The root and /dev are read-only: the only writable mounts are /work, /tmp and /dev/shm, each
a tmpfs of `disk_bytes` (so what a program can store is bounded with or without cgroups;
/work is the host's tmpfs when we are root, see `Sandbox`). The command runs as the
namespace's pid 1: when it exits, or is killed, the kernel kills everything else inside.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from longhaul.errors import LonghaulError
from longhaul.sandbox.spec import SandboxSpec

SANDBOX_UID = 1000
# system trees a normal program needs; each is bound read-only if it exists on the host
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
ETC = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
       "/etc/ssl", "/etc/ca-certificates", "/etc/mime.types", "/etc/python3", "/etc/python3.11")


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if not path:
        raise LonghaulError("bubblewrap (bwrap) is not installed; run `apt-get install bubblewrap`, or choose backend='process' (no isolation)")
    return path


def _reachable_by_others(path: str) -> bool:
    p = Path(path)
    return all(os.stat(q).st_mode & 0o001 for q in [p, *p.parents])


def _is_mountpoint(p: Path) -> bool:
    # os.path.ismount misses bind mounts within one filesystem; mountinfo does not
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(p) for line in f)


def _same_inode(a, b) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def expose(path: str) -> str:
    """A host path that the unprivileged sandbox uid can reach. When an ancestor is private
    (a pyenv Python under /root, say) and we are root, bind-mount it read-only once under
    /run/longhaul/expose and bind that instead."""
    if os.geteuid() != 0 or _reachable_by_others(path):
        return path
    mp = Path("/run/longhaul/expose") / hashlib.sha256(path.encode()).hexdigest()[:12]
    if _is_mountpoint(mp) and not _same_inode(mp, path):  # the source was deleted and rebuilt since
        subprocess.run(["umount", "-l", str(mp)], capture_output=True)
    if not _is_mountpoint(mp):
        mp.mkdir(parents=True, exist_ok=True)
        for q in [mp, *mp.parents]:
            if q != Path("/"):
                os.chmod(q, os.stat(q).st_mode | 0o005)
        subprocess.run(["mount", "--bind", path, str(mp)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mp)], check=True, capture_output=True)
    return str(mp)


def write_etc(root: Path) -> Path:
    """A minimal /etc/passwd and /etc/group naming only the sandbox user."""
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/work:/bin/sh\nnobody:x:65534:65534:nobody:/:/usr/sbin/nologin\n")
    (etc / "group").write_text(f"sandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    (etc / "resolv.conf").write_text("")  # no DNS servers
    return etc


def bwrap_argv(spec: SandboxSpec, workdir: Path, etc: Path, argv: list[str], cwd: str = "/work") -> list[str]:
    a = [bwrap_path(), "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "--unshare-user", "--disable-userns",
         "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--cap-drop", "ALL"]
    for p in SYSTEM:
        if os.path.islink(p):
            a += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            a += ["--ro-bind", p, p]
    for p in ETC:
        if os.path.exists(p):
            a += ["--ro-bind", p, p]
    for name in ("passwd", "group", "hosts", "resolv.conf"):
        a += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    py = spec.python
    if py and os.path.isdir(py) and not py.startswith("/usr"):
        a += ["--ro-bind", expose(py), py]
    for src, dst in spec.ro_binds:
        a += ["--ro-bind", src, dst]
    a += ["--proc", "/proc", "--dev", "/dev",
          "--size", str(spec.disk_bytes), "--tmpfs", "/tmp",
          "--size", str(spec.disk_bytes), "--tmpfs", "/dev/shm",
          "--remount-ro", "/dev",  # device nodes stay usable; no files beside them
          "--bind", str(workdir), "/work",
          "--remount-ro", "/",  # last: every mount point above is made on the root tmpfs first
          "--chdir", cwd, "--clearenv"]
    for k, v in sandbox_env(spec).items():
        a += ["--setenv", k, v]
    return a + ["--", *argv]


def sandbox_env(spec: SandboxSpec, python_dir: str | None = None) -> dict:
    """The environment inside: spec.env, the allowed names, and the interpreter first on PATH
    (at `python_dir` where it is seen elsewhere, as with the process backend)."""
    env = dict(spec.env)
    if spec.python and "PATH" in env:
        env["PATH"] = f"{python_dir or spec.python}/bin:{env['PATH']}"
    for name in spec.env_allow:
        if name in os.environ:
            env[name] = os.environ[name]
    return env
