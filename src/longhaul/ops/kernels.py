"""Native CPU kernels of the engine and the trainer, built once on first use and cached.

Owns building and loading `csrc/*.cpp` (one module) with torch's C++ extension loader into
`$LONGHAUL_KERNEL_CACHE/<torch version>-<hash>/` (default `~/.cache/longhaul/kernels`,
shared by every `LONGHAUL_HOME`: a build depends only on the sources, the flags and the torch
install it compiles against, which the hash covers, so two virtual environments on one machine
never rebuild each other's directory or wait on each other's lock; the sources are compiled
from a copy inside the build directory, so two checkouts of the same sources share one build; a file
lock there keeps concurrent processes, e.g. Ray actors, from building twice; each load marks its
directory used and removes all but the `KEEP_BUILDS` most recently used others, so source edits do
not pile up builds), and saying why a kernel is unavailable.
Does not own where a kernel is used (`linear.pack`, `ModelRunner`).

A kernel is used only where it can run: an x86 CPU with AVX2 and FMA, a C++ compiler and
ninja. Anywhere else, or with `LONGHAUL_KERNELS=0`, or when the build fails, `native()`
returns None after one stderr line that says why, and callers keep the oneDNN path (same
maths, slower). `python -m longhaul.ops.kernels` builds ahead of time (`make setup`
does), so the first run does not pay the ~1 minute build.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp"]
KEEP_BUILDS = 3  # other builds kept beside the one loaded (other checkouts, other torch versions)
LOCKING = "builder.flock"  # the file every loader flocks around torch's load (`_builder`)
DEAD_LOCK_S = 120.0  # torch's lock file this old, seen by the flock's holder, has no builder


def _unavailable(why: str) -> None:
    print(f"longhaul: native decode kernels off ({why}); using torch's ops", file=sys.stderr)


def _missing_requirement() -> str | None:
    """Why the kernels cannot be built or run here, or None when they can."""
    if os.environ.get("LONGHAUL_KERNELS") == "0":
        return "LONGHAUL_KERNELS=0"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"the CPU has {capability}, the kernel needs AVX2 and FMA"
    from torch.utils.cpp_extension import is_ninja_available

    if not (shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")):
        return "no C++ compiler; apt-get install g++"
    if not is_ninja_available():
        return "ninja is missing; pip install ninja"
    return None


def build_dir(sources: list[Path]) -> Path:
    root = Path(os.environ.get("LONGHAUL_KERNEL_CACHE") or Path.home() / ".cache" / "longhaul" / "kernels")
    files = sorted({*sources, *CSRC.glob("*.h")})
    # torch's location as this interpreter sees it (not resolved): its include paths are written into the build as
    # seen, so another venv's torch, or the same one through a symlinked venv, is another build
    where = str(Path(torch.__file__).absolute().parent)
    # LOCKING names the loaders' lock protocol: loaders that lock differently never share a build
    key = b"".join(f.read_bytes() for f in files) + " ".join(FLAGS).encode() + where.encode() + LOCKING.encode()
    digest = hashlib.sha256(key).hexdigest()[:12]
    return root / f"torch{torch.__version__.split('+')[0]}-{digest}"


@lru_cache(maxsize=None)
def native():
    """The kernel module, or None: `pack(w)` / `mm(x, packed, n, bias)` (small-batch fp32
    GEMM), `decode_attention(q, k, v, block_tables, lens, block_size, scale)`, `rms_norm(x, w, eps)`,
    `softmax_stats(z, targets, with_entropy, write_probs)` (the fused head's log-softmax)."""
    why = _missing_requirement()
    if why is not None:
        if why != "LONGHAUL_KERNELS=0":
            _unavailable(why)
        return None
    sources = sorted(CSRC.glob("*.cpp"))
    out = build_dir(sources)
    try:
        from torch.utils.cpp_extension import load

        out.mkdir(parents=True, exist_ok=True)
        if not any(out.glob("*.so")):
            print(f"longhaul: building the native decode kernels into {out} (once, about a minute)", file=sys.stderr, flush=True)
        with _builder(out):
            module = load(name="longhaul_cpu_kernels", sources=[str(s) for s in _own_copy(out)], build_directory=str(out),
                          extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # a compiler or linker error: the engine still runs on oneDNN
        lines = str(e).strip().splitlines()
        first = next((ln for ln in lines if "error:" in ln), lines[0] if lines else type(e).__name__)
        _unavailable(f"build failed: {first[:200]}")
        return None
    prune_builds(out)
    return module


def _own_copy(out: Path) -> list[Path]:
    """The sources copied into the build directory (same bytes: its name is their hash), so the
    build names paths of its own: torch's loader rewrites the build file whenever the sources'
    paths change, and ninja then rebuilds, so two checkouts of the same sources would otherwise
    rebuild each other's build on every first use."""
    src = out / "src"
    src.mkdir(exist_ok=True)
    for f in sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h")):
        dst = src / f.name
        if not dst.exists():
            tmp = src / f".{f.name}.{os.getpid()}.tmp"
            shutil.copy2(f, tmp)
            os.replace(tmp, dst)
    return sorted(src.glob("*.cpp"))


@contextmanager
def _builder(out: Path):
    """Hold an flock on `out/builder.flock` while torch's loader runs. torch's own lock
    (`out/lock`) is a plain file that a killed loader leaves behind, and every later loader
    waits on it forever; an flock is released by the kernel when its holder dies. Every loader
    holds the flock while it loads, so the `lock` file its holder finds was left by a loader that
    is gone, or by a compiler that loader started and that may still be writing: it is removed
    once it is `DEAD_LOCK_S` old. Where flock is unavailable (some network file systems), torch's
    lock alone guards the build, as before."""
    fd = _open_lock(out / LOCKING)
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"longhaul: waiting for the kernel build in {out} (another process holds it)", file=sys.stderr, flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            _clear_dead_lock(out / "lock")
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


def _open_lock(path: Path) -> int | None:
    """A descriptor to flock `path` through (read-only where the file is another user's), or
    None where flock cannot be used here."""
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            fd = os.open(path, flags, 0o666)
        except PermissionError:
            continue
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe: can this file system flock at all
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            pass  # held by a builder: flock works
        except OSError:  # ENOLCK, EOPNOTSUPP
            os.close(fd)
            return None
        return fd
    return None


def _clear_dead_lock(lock: Path) -> None:
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:
            return
        if age >= DEAD_LOCK_S:
            print(f"longhaul: removing {lock}, left by a kernel build that did not finish", file=sys.stderr, flush=True)
            lock.unlink(missing_ok=True)
            return
        time.sleep(min(1.0, DEAD_LOCK_S - age))


def prune_builds(current: Path, keep: int = KEEP_BUILDS) -> list[Path]:
    """Mark `current` used and delete the builds beside it but the `keep` most recently used; a
    build another process is loading (its flock held, or torch's lock file present) is left
    alone. A cache, so a deleted build that is wanted again is rebuilt. Returns the directories
    removed."""
    try:
        os.utime(current)
        others = [d for d in current.parent.glob("torch*-*") if d.is_dir() and d != current]
        others.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    except OSError:  # a read-only or vanished cache: nothing to tidy
        return []
    removed = []
    for d in others[keep:]:
        if (d / "lock").exists():
            continue
        fd = _open_lock(d / LOCKING)
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        except BlockingIOError:
            continue  # a loader holds it
        finally:
            if fd is not None:
                os.close(fd)
    return removed


if __name__ == "__main__":
    sys.exit(0 if native() is not None else 1)
