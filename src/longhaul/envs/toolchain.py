"""The professional tools an agent finds inside a workspace sandbox: pytest and ruff.

They are copied once from this Python environment (where they are dependencies of longhaul)
into `$LONGHAUL_HOME/toolchain/<hash>/` and bound read-only at /opt/longhaul in the sandbox:
`site/` goes on PYTHONPATH, `bin/` on PATH. Nothing else of the host environment is visible.
git, bash and coreutils come from the system (/usr), which the sandbox binds read-only.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from longhaul.errors import LonghaulError
from longhaul.home import cache_home

DISTS = ("pytest", "pluggy", "iniconfig", "packaging", "ruff")
MOUNT = "/opt/longhaul"


def _dist(name: str):
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise LonghaulError(f"the sandbox toolchain needs {name!r} in this environment; run `pip install {name}`") from None


def toolchain_dir() -> Path:
    """The toolchain directory for the installed versions, built on first use (atomically)."""
    dists = [_dist(n) for n in DISTS]
    key = hashlib.sha256(" ".join(f"{d.metadata['Name']}=={d.version}" for d in dists).encode()).hexdigest()[:12]
    final = cache_home() / "toolchain" / key
    if (final / "ok").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=final.parent))
    (tmp / "site").mkdir()
    (tmp / "bin").mkdir()
    for d in dists:
        for f in d.files or []:
            src = Path(d.locate_file(f))
            parts = Path(f).parts
            if parts and parts[0] == ".." or not src.is_file():
                # console scripts live outside site-packages; only ruff's binary is wanted from there
                if src.name == "ruff" and src.is_file():
                    shutil.copy2(src, tmp / "bin" / "ruff")
                continue
            if parts[0].endswith(".dist-info") or "__pycache__" in parts:
                continue
            dst = tmp / "site" / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    if not (tmp / "bin" / "ruff").exists():
        found = shutil.which("ruff")
        if found:
            shutil.copy2(found, tmp / "bin" / "ruff")
    # The sandbox python never writes bytecode (read-only mount): compile once here, or every
    # pytest start inside pays ~1 s compiling pytest itself.
    compileall.compile_dir(str(tmp / "site"), quiet=2, workers=1)
    pytest_bin = tmp / "bin" / "pytest"
    pytest_bin.write_text("#!/bin/sh\nexec python3 -m pytest \"$@\"\n")
    for p in (tmp, tmp / "site", tmp / "bin", *(tmp / "site").rglob("*"), *(tmp / "bin").iterdir()):
        os.chmod(p, (os.stat(p).st_mode | 0o444 | (0o111 if p.is_dir() or p.parent.name == "bin" else 0)))
    (tmp / "ok").write_text("ok\n")
    try:
        tmp.rename(final)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def sandbox_env(base: dict) -> dict:
    """`base` (a SandboxSpec env) with the toolchain on PATH and PYTHONPATH, and git set up
    to commit without a user config."""
    env = dict(base)
    env["PATH"] = f"{MOUNT}/bin:" + env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PYTHONPATH"] = f"{MOUNT}/site"
    env.update({"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@sandbox", "GIT_COMMITTER_NAME": "agent",
                "GIT_COMMITTER_EMAIL": "agent@sandbox", "GIT_CONFIG_NOSYSTEM": "1", "RUFF_CACHE_DIR": "/tmp/ruff-cache",
                "PYTEST_ADDOPTS": "-p no:cacheprovider", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    return env
