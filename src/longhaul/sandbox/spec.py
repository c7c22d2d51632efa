"""What a sandbox may do (`SandboxSpec`) and what one command did (`ExecResult`)."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Literal

# why a command stopped, read from facts the program cannot forge (runner.classify); fsize: a
# file over fsize_bytes (SIGXFSZ) or the workdir tmpfs full
LimitHit = Literal["wall", "cpu", "memory", "pids", "fsize", "output"]

DEFAULT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


@dataclass(frozen=True)
class SandboxSpec:
    wall_s: float = 30.0  # per exec, unless exec(timeout=...) says otherwise
    cpu_s: float = 30.0  # per process (RLIMIT_CPU)
    memory_bytes: int = 512 << 20  # whole sandbox (cgroup), else per process (RLIMIT_AS)
    pids: int = 64  # whole sandbox (cgroup), else per sandbox uid (RLIMIT_NPROC)
    fsize_bytes: int = 64 << 20  # largest file a process may write (RLIMIT_FSIZE)
    disk_bytes: int = 256 << 20  # size of the workdir tmpfs (and of /tmp, /dev/shm)
    open_files: int = 256  # RLIMIT_NOFILE
    network: Literal["none", "loopback"] = "none"  # both: a private network namespace; never the host's
    env: dict = field(default_factory=lambda: dict(DEFAULT_ENV))  # the whole environment inside
    env_allow: tuple[str, ...] = ()  # names copied from the caller's environment, nothing else is
    ro_binds: tuple[tuple[str, str], ...] = ()  # (host path, sandbox path), read-only
    allow_commands: tuple[str, ...] | None = None  # argv[0] basenames; None allows any
    output_bytes: int = 1 << 20  # per stream; beyond it the command is stopped (limit_hit "output")
    python: str = sys.base_prefix  # interpreter tree bound read-only, so `python3` works inside

    def __post_init__(self):
        for name in ("wall_s", "cpu_s", "memory_bytes", "pids", "fsize_bytes", "disk_bytes", "open_files", "output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxSpec.{name} must be positive, got {getattr(self, name)}")
        if self.network not in ("none", "loopback"):
            raise ValueError(f"SandboxSpec.network must be 'none' or 'loopback', got {self.network!r}")

    def limits(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in ("wall_s", "cpu_s", "memory_bytes", "pids", "fsize_bytes", "disk_bytes", "open_files", "network")}


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    stdout: str  # decoded with replacement; non-UTF-8 bytes never raise
    stderr: str
    truncated: bool  # a stream went over output_bytes
    limit_hit: LimitHit | None
    wall_s: float
    cpu_s: float
    peak_rss: int  # bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit_hit is None

    def to_dict(self) -> dict:
        return asdict(self)
