"""The process's C allocator: keep freed buffers for reuse instead of handing them back to the OS,
without the heap growing past what a step needs.

Owns which allocator longhaul's processes use and its process-wide settings: `preload_env()`
and `reexec_with_preload()` (the CLI starts itself again with jemalloc preloaded, so every
process it starts has it too), `keep_freed_memory()` (glibc's settings, which longhaul's own
processes call at start), the heap's counters (`heap()`), bounding the free heap between
steps (`between_steps`) and within one: between micro-batches and the layers of a long forward
(`within_step`), handing an idle buffer's pages back while keeping it (`discard`), and the
bound on oneDNN's caches of compiled kernels (`bound_kernel_caches`).
Does not own torch's tensors or any cache of them.

Why: a training step allocates and frees gigabytes of activations, gradients and logit chunks
in buffers of 1 to 100 MB. glibc's malloc serves buffers that large with mmap and returns them
with munmap, so every step page-faults its buffers in again, page by page. On the 2-core VM
measured here a fault costs ~4 us a 4 KiB page (~1 ms a MB: zeroing the 113 MB embedding
gradient took 106 ms). Two ways to keep them:
- jemalloc (Debian's libjemalloc2; `make setup` installs it), preloaded, with its decay off
  (`JEMALLOC_CONF`): freed pages stay mapped, and its size-classed extents are reused across
  layers and steps. A GRPO micro-batch of two 4,000-token episodes (SmolLM2 + LoRA, bf16) peaked
  at 2.75 GB in 38.8 s, against glibc kept (below) 4.40 GB in 46.5 s, and 2.42 GB in 65.0 s with
  every buffer over 1 MB mapped and unmapped on its own (benchmarks/step_memory.py;
  docs/results/training.md, "Memory of a long training step").
- glibc with mmap off (M_MMAP_MAX 0) and no trimming of the heap's top (M_TRIM_THRESHOLD -1):
  freed memory stays mapped and later steps reuse much of it, but not all: large buffers that
  do not fit the holes earlier ones left go to the heap's top, so over the 30 layers of a long
  forward the free heap grows by gigabytes; `within_step` bounds it between micro-batches and
  layers (3.56 GB in 46.9 s).
Either way, training processes bound the free heap between steps and micro-batches
(`free_limit`: 2 GB unless `LONGHAUL_MALLOC_FREE_GB` says otherwise).
`LONGHAUL_MALLOC=glibc` skips jemalloc; `LONGHAUL_MALLOC=system` keeps the C library's defaults
too. Threads other than the main one allocate from their own arenas, where glibc still maps
requests over 64 MiB. Non-glibc systems keep their allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

from longhaul.errors import LonghaulError

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameter numbers (malloc.h)
_done: bool | None = None
# freed pages stay mapped (no decay); buffers of every size share the arenas (no oversize arena,
# which would hand large buffers back at once); a free extent serves a request however much
# larger it is (by default jemalloc reuses one only for requests of at least 1/64 of its size:
# the buffers of a step, freed together, coalesce into extents of gigabytes that the next step's
# buffers of a few MB could not use, so every step mapped new memory)
JEMALLOC_CONF = "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1,lg_extent_max_active_fit:30"
_JEMALLOC = "libjemalloc.so.2"
_ALL_ARENAS = 4096  # MALLCTL_ARENAS_ALL
_PRELOADED = "LONGHAUL_MALLOC_PRELOADED"  # set in the environment of a process started again with jemalloc


def _mode() -> str:
    return os.environ.get("LONGHAUL_MALLOC", "keep")


_mallctl_fn: list = []  # [mallctl or None], looked up once: the allocator cannot change after start


def _mallctl():
    """jemalloc's mallctl when jemalloc is this process's allocator, else None."""
    if not _mallctl_fn:
        try:
            fn = ctypes.CDLL(None).mallctl
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _mallctl_fn.append(fn)
    return _mallctl_fn[0]


def allocator() -> str:
    """The C allocator in use: "jemalloc", "glibc (kept)", "glibc" (its defaults) or "system"."""
    if _mallctl() is not None:
        return "jemalloc"
    if getattr(_libc(), "mallinfo2", None) is not None:
        return "glibc (kept)" if _done else "glibc"
    return "system"


def preload_env() -> dict[str, str]:
    """The environment that starts a process with jemalloc preloaded, or {} (jemalloc already
    in use, not installed, not Linux, or LONGHAUL_MALLOC says otherwise)."""
    if _mode() != "keep" or not sys.platform.startswith("linux") or os.environ.get(_PRELOADED) or _mallctl() is not None:
        return {}
    if ctypes.util.find_library("jemalloc") != _JEMALLOC:  # another major version, or only the -dev link
        return {}
    preload = " ".join(p for p in (os.environ.get("LD_PRELOAD", ""), _JEMALLOC) if p)
    return {"LD_PRELOAD": preload, "MALLOC_CONF": os.environ.get("MALLOC_CONF", JEMALLOC_CONF), _PRELOADED: "1"}


# oneDNN's caches of compiled kernels, each entry holding its JIT code and buffers (~1 MB): the
# primitive cache and PyTorch's own (ideep's) LRU of matmul computations, 1,024 entries each by
# default. A kernel is compiled per shape, and packed training batches have a new token count at
# every micro-batch, so both fill over a run (about a gigabyte). 64 entries still hold every
# kernel one micro-batch's forward and backward reuse across its layers; far fewer would compile
# them again layer after layer (docs/results/training.md, "Memory of a long training step").
KERNEL_CACHE_ENTRIES = 64
_KERNEL_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
_KERNEL_CACHES_SET = "LONGHAUL_KERNEL_CACHES"  # the variables of _KERNEL_CACHES that longhaul set


def bound_kernel_caches() -> None:
    """Cap oneDNN's kernel caches at KERNEL_CACHE_ENTRIES, where the environment does not set
    them. Read when the first kernel is built, so `import longhaul` calls this before any runs;
    child processes inherit it."""
    ours = [k for k in _KERNEL_CACHES if k not in os.environ]
    for k in ours:
        os.environ[k] = str(KERNEL_CACHE_ENTRIES)
    if ours:
        os.environ[_KERNEL_CACHES_SET] = " ".join(ours)


def foreign_env(env: dict | None = None) -> dict:
    """`env` (default: this process's) without the jemalloc preload, the kernel cache bounds and
    the other settings longhaul added: for programs that are not longhaul (the anchors a
    benchmark compares against)."""
    env = dict(os.environ if env is None else env)
    for k in env.pop(_KERNEL_CACHES_SET, "").split():
        env.pop(k, None)
    if env.pop(_PRELOADED, None) is not None:
        rest = " ".join(p for p in env.get("LD_PRELOAD", "").split() if p != _JEMALLOC)
        env.pop("LD_PRELOAD") if not rest else env.update(LD_PRELOAD=rest)
        if env.get("MALLOC_CONF") == JEMALLOC_CONF:
            env.pop("MALLOC_CONF")
    return env


def reexec_with_preload() -> None:
    """Replace this process by itself (the same interpreter and command line) with jemalloc
    preloaded; returns only when there is nothing to do. Call first thing: nothing done before
    survives."""
    extra = preload_env()
    if extra:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **extra})


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                 "uordblks", "fordblks", "keepcost")]


@functools.cache
def _libc():
    """The C library, loaded once (finding it runs ldconfig; `within_step` reads the heap every layer)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _jemalloc_stat(mallctl, name: str) -> int:
    v, n = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    return v.value if mallctl(name.encode(), ctypes.byref(v), ctypes.byref(n), None, 0) == 0 else 0


def heap() -> tuple[int, int] | None:
    """(bytes in use, bytes held free) of the C heap: glibc's malloc over all arenas, or
    jemalloc's allocated and its resident pages less that; None elsewhere."""
    mallctl = _mallctl()
    if mallctl is not None:
        epoch = ctypes.c_uint64(1)
        mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))  # refresh the statistics
        used = _jemalloc_stat(mallctl, "stats.allocated")
        return used, max(0, _jemalloc_stat(mallctl, "stats.resident") - used)
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None)  # not glibc, or glibc before 2.33: None
    if fn is None:
        return None
    fn.restype = _Mallinfo2
    m = fn()
    return m.uordblks + m.hblkhd, m.fordblks


def _resident() -> int:
    """Anonymous resident memory (the heap's pages among it; not mapped files), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def bound_free_heap(limit: int) -> int:
    """When the heap holds more than `limit` bytes free and resident, hand its free pages back to
    the OS (glibc's `malloc_trim`, jemalloc's purge of every arena). Returns the bytes anonymous
    resident memory fell by (0: nothing done). jemalloc counts its free pages exactly. Under
    glibc, resident free heap is read as anonymous resident memory less the heap in use, an
    over-estimate by what sits outside the heap (Python's object arenas, thread stacks): free
    chunks already handed back stay in glibc's free count, so that count alone would trim at
    every call after the first."""
    held = heap()
    if held is None or held[1] <= limit:
        return 0
    before = _resident()
    mallctl = _mallctl()
    if mallctl is not None:
        mallctl(f"arena.{_ALL_ARENAS}.purge".encode(), None, None, None, 0)
    elif before - held[0] <= limit:
        return 0
    else:
        _libc().malloc_trim(ctypes.c_size_t(0))
    return max(0, before - _resident())


_MADV_DONTNEED = 4  # madvise(2)


def discard(address: int, nbytes: int) -> tuple[int, int]:
    """Hand the memory pages wholly inside [address, address + nbytes) back to the kernel
    (madvise MADV_DONTNEED) while the allocation stays: the next touch of a page maps a fresh
    one, which reads as zeros in private anonymous memory (every heap allocation; shared and
    file-backed memory read back their content instead). For buffers kept allocated whose
    content no longer matters, such as an idle engine's KV pool. Returns (lo, hi), the offsets
    from `address` of the bytes discarded: the partly covered pages at either end keep theirs.
    (0, 0) when nothing was: off Linux, or a range within one page."""
    libc = _libc()
    madvise = getattr(libc, "madvise", None)
    page = os.sysconf("SC_PAGE_SIZE") if madvise is not None else 1
    start = -(-address // page) * page
    end = (address + nbytes) // page * page
    if madvise is None or end <= start:
        return 0, 0
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    if madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED) != 0:
        return 0, 0
    return start - address, end - address


def resident_bytes(address: int, nbytes: int) -> int:
    """Bytes of the pages touching [address, address + nbytes) that are resident now (mincore):
    a buffer whose pages were discarded (`discard`) counts only what was written since.
    `nbytes` off Linux."""
    libc = _libc()
    mincore = getattr(libc, "mincore", None)
    if mincore is None or nbytes <= 0:
        return max(0, nbytes)
    page = os.sysconf("SC_PAGE_SIZE")
    start = address // page * page
    pages = -(-(address + nbytes - start) // page)
    vec = (ctypes.c_ubyte * pages)()
    mincore.argtypes, mincore.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p], ctypes.c_int
    if mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vec) != 0:
        return nbytes
    return min(nbytes, sum(b & 1 for b in bytes(vec)) * page)


def keep_freed_memory() -> bool:
    """Switch glibc's malloc to keep freed memory mapped for reuse (idempotent). True when set."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if _mode() == "system" or not sys.platform.startswith("linux") or _mallctl() is not None:
        return False  # jemalloc keeps freed memory by its own configuration (`JEMALLOC_CONF`)
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # musl and other C libraries without mallopt keep their defaults
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; a trim threshold of -1 turns trimming off (mallopt(3))
    _done = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, -1))
    return _done


FREE_GB = 2.0  # free heap a training process keeps by default (LONGHAUL_MALLOC_FREE_GB overrides)
_UNBOUNDED = ("off", "none", "inf")


def free_limit() -> int | None:
    """Free heap a training process may hold between steps and micro-batches, in bytes:
    `LONGHAUL_MALLOC_FREE_GB` (GB), FREE_GB when unset, None (no bound) for off/none/inf.
    The bound caps what a process keeps should its freed buffers stop fitting what later steps
    ask for (docs/results/training.md, "The single-turn quickstart")."""
    v = os.environ.get("LONGHAUL_MALLOC_FREE_GB", "").strip().lower()
    if not v:
        return int(FREE_GB * 1e9)
    if v in _UNBOUNDED:
        return None
    try:
        gb = float(v)
    except ValueError:
        gb = -1.0
    if not gb >= 0:
        raise LonghaulError(f"LONGHAUL_MALLOC_FREE_GB={v!r} is not a size in GB; set e.g. 2, or off to keep all freed memory")
    return int(gb * 1e9)


def between_steps() -> dict:
    """What a training loop calls after each step: bound the free heap to `free_limit()` (unless
    that is off); the metric to log (`memory/trimmed_gb`), or nothing."""
    limit = free_limit()
    return {} if limit is None else {"memory/trimmed_gb": bound_free_heap(limit) / 1e9}


def within_step() -> int:
    """What a training step calls between its micro-batches, and a long forward or backward
    between its layers: bound the free heap to `free_limit()` (a no-op while the heap holds less).
    Micro-batches of growing lengths (a step's are sorted by length) each need larger buffers
    than the ones before freed, so without it the kept heap grows over a step. Returns the bytes
    resident memory fell by."""
    limit = free_limit()
    return 0 if limit is None else bound_free_heap(limit)
