"""`longhaul.malloc`: freed buffers stay mapped for reuse (glibc kept, or jemalloc preloaded by the
CLI), the opt-outs, and bounding the free heap."""

import ctypes.util
import os
import subprocess
import sys

import pytest

# a child process: the setting is process-wide. Like a training step, it allocates and touches
# buffers of several sizes (81 MB in all) and frees them; it prints how much of that memory is
# still resident after the free (MB), and the minor page faults of touching it all again.
CHILD = r"""
import os
from longhaul.malloc import keep_freed_memory
kept = keep_freed_memory()
assert keep_freed_memory() == kept  # idempotent
import torch
def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
def minflt():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])
r0 = resident_mb()
bufs = [torch.ones(n << 18) for n in (8, 20, 3, 50)]  # MB
r1 = resident_mb()
del bufs
r2 = resident_mb()
f0 = minflt()
bufs = [torch.ones(n << 18) for n in (8, 20, 3, 50)]
print(kept, round(r1 - r0), round(r2 - r0), minflt() - f0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux only")
@pytest.mark.parametrize("mode", ["keep", "system"])
def test_freed_buffers_stay_mapped_unless_opted_out(mode):
    env = {"PATH": "/usr/bin:/bin", "LONGHAUL_MALLOC": mode, "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    kept, grown, left, faults = out.stdout.split()
    assert int(grown) >= 78  # the buffers were resident
    if mode == "keep":
        assert kept == "True" and int(left) >= 75  # freed, but still mapped: nothing handed back
    else:
        # glibc unmapped the large buffers: they are gone, and touching new ones faults them in again
        assert kept == "False" and int(left) < 20 and int(faults) > 0.5 * (78 << 20) / os.sysconf("SC_PAGE_SIZE")


HAS_JEMALLOC = ctypes.util.find_library("jemalloc") == "libjemalloc.so.2"

# 600 MB of freed buffers bounded to 300 MB: anonymous resident memory falls. Then 100 MB more
# freed, under the limit: kept (the second call hands nothing back, resident stays), though
# glibc's free count still holds the 600 MB handed back before.
BOUND = r"""
import os
from longhaul import malloc
malloc.keep_freed_memory()
import torch
def resident_mb():
    return malloc._resident() / 2**20
bufs = [torch.ones(n << 18) for n in (100, 200, 300)]
del bufs
r0 = resident_mb()
first = malloc.bound_free_heap(300 << 20) >> 20
fell = r0 - resident_mb()
bufs = [torch.ones(100 << 18)]
del bufs
r1 = resident_mb()
second = malloc.bound_free_heap(300 << 20) >> 20
print(malloc.allocator().replace(" ", "_"), round(fell), first, second, round(r1 - resident_mb()))
"""


def _child(code: str, mode: str, preload: bool = False) -> list[str]:
    from longhaul.malloc import preload_env

    env = {"PATH": "/usr/bin:/bin", "LONGHAUL_MALLOC": mode, "PYTHONPATH": ":".join(sys.path)}
    if preload:
        with pytest.MonkeyPatch.context() as mp:  # this test process runs with LONGHAUL_MALLOC=system (conftest)
            mp.setenv("LONGHAUL_MALLOC", "keep")
            mp.delenv("LONGHAUL_MALLOC_PRELOADED", raising=False)
            # under a test process that itself runs with the preload, the child inherits the same
            extra = preload_env() or {k: os.environ[k] for k in ("LD_PRELOAD", "MALLOC_CONF") if k in os.environ}
        assert extra, "libjemalloc2 is installed, yet no preload"
        env.update(extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


JEMALLOC = pytest.mark.skipif(not HAS_JEMALLOC, reason="libjemalloc2 not installed")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux only")
@pytest.mark.parametrize("preload", [False, pytest.param(True, marks=JEMALLOC)])
def test_bound_free_heap_hands_back_past_the_limit_only(preload):
    name, fell, first, second, kept_fell = _child(BOUND, "keep", preload)
    assert name == ("jemalloc" if preload else "glibc_(kept)")
    assert int(fell) >= 250 and int(first) >= 250, (fell, first)  # most of what passed the limit went back
    assert int(second) == 0 and int(kept_fell) < 20, (second, kept_fell)  # under the limit: nothing handed back


@JEMALLOC
def test_jemalloc_keeps_freed_buffers_mapped():
    kept, grown, left, faults = _child(CHILD, "keep", preload=True)
    assert kept == "False"  # glibc's settings untouched: jemalloc keeps memory by its own configuration
    assert int(grown) >= 78 and int(left) >= 75 and int(faults) < 0.25 * (78 << 20) / os.sysconf("SC_PAGE_SIZE")


# 512 MB of 8 MB buffers freed together (their extents coalesce into one free extent of ~512 MB),
# then 512 MB again as 1 MB buffers: the heap's footprint (in use + free) grows by how much of
# the second round did not fit into what the first left free (MB).
REFIT = r"""
from longhaul import malloc
import torch
bufs = [torch.ones(8 << 18) for _ in range(64)]
del bufs
before = sum(malloc.heap())
bufs = [torch.ones(1 << 18) for _ in range(512)]
print(round((sum(malloc.heap()) - before) / 2**20))
"""


@JEMALLOC
def test_jemalloc_reuses_a_large_free_extent_for_small_buffers():
    # jemalloc's default (a free extent serves only requests of >= 1/64 of its size) grew this by
    # ~265 MB; a training step's buffers, freed together, grew the heap ~1 GB a step that way
    grown, = _child(REFIT, "keep", preload=True)
    assert int(grown) < 64, grown


# 600 MB allocated whose pages were handed back (a sleeping KV pool), 400 MB freed: jemalloc
# holds 400 MB free, though anonymous resident memory less the heap in use says none. Then an
# update's end in the inline rollouts, with the pool's 300 MB about to page back in: bounded to
# 500 MB less them. Prints the MB each call handed back.
SLEPT = r"""
import os
os.environ["LONGHAUL_MALLOC_FREE_GB"] = "0.5"
from longhaul import malloc
import torch
from longhaul.runtime.local import InlineRollouts
pool = torch.ones(600 << 18)
st = pool.untyped_storage()
malloc.discard(st.data_ptr(), st.nbytes())
bufs = [torch.ones(4 << 18) for _ in range(100)]
del bufs
first = malloc.bound_free_heap(200 << 20) >> 20
bufs = [torch.ones(4 << 18) for _ in range(100)]
del bufs
rollouts = InlineRollouts.__new__(InlineRollouts)
rollouts.kv_slept = 0
rollouts.training(False)
kept = malloc.heap()[1] >> 20
rollouts.kv_slept = 300 << 20
rollouts.training(False)
print(first, kept, malloc.heap()[1] >> 20)
"""


@JEMALLOC
def test_jemalloc_s_free_pages_are_bounded_beside_a_discarded_buffer():
    first, kept, after = map(int, _child(SLEPT, "keep", preload=True))
    assert first >= 350, first  # counted as free though resident less in-use reads none
    assert kept >= 350 and after < 100, (kept, after)  # under 500 MB alone; over it with the pool's 300 coming back


@pytest.mark.parametrize("mode,want", [pytest.param("keep", "jemalloc", marks=JEMALLOC), ("glibc", "glibc (kept)"),
                                       ("system", "glibc")])
def test_the_cli_starts_itself_with_the_allocator_asked_for(mode, want):
    env = {**os.environ, "LONGHAUL_MALLOC": mode}
    env.pop("LONGHAUL_MALLOC_PRELOADED", None)
    env.pop("LD_PRELOAD", None)
    out = subprocess.run([sys.executable, "-m", "longhaul.cli", "env"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"allocator: {want}" in out.stdout.splitlines(), out.stdout


def test_foreign_env_drops_only_what_the_preload_added():
    from longhaul.malloc import JEMALLOC_CONF, foreign_env

    ours = {"LD_PRELOAD": "libfoo.so libjemalloc.so.2", "MALLOC_CONF": JEMALLOC_CONF, "LONGHAUL_MALLOC_PRELOADED": "1", "X": "1"}
    assert foreign_env(ours) == {"LD_PRELOAD": "libfoo.so", "X": "1"}
    theirs = {"LD_PRELOAD": "libjemalloc.so.2", "MALLOC_CONF": "narenas:2"}  # the user's own, not added by longhaul
    assert foreign_env(theirs) == theirs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux only")
def test_discard_hands_whole_pages_back_and_they_read_as_zeros():
    import torch

    from longhaul.malloc import _resident, discard

    buf = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB, resident
    page = os.sysconf("SC_PAGE_SIZE")
    before = _resident()
    lo, hi = discard(buf.data_ptr(), buf.numel())
    assert 0 <= lo < page and buf.numel() - page < hi <= buf.numel() and (buf.data_ptr() + lo) % page == 0
    assert before - _resident() >= 0.9 * (hi - lo)
    assert not buf[lo:hi].any() and bool(buf[:lo].all()) and bool(buf[hi:].all())  # partly covered pages keep theirs
    buf.fill_(2)  # the allocation is still there: it pages back in on write
    assert bool((buf == 2).all())
    assert discard(buf.data_ptr() + 1, page - 2) == (0, 0)  # no whole page inside


# bf16 matmuls of 150 shapes, forward and backward, as packed training batches have a new token
# count at every micro-batch: resident growth in MB, with oneDNN's kernel caches as the
# environment leaves them after `import longhaul`
KERNELS = r"""
import os
import longhaul
import torch
print(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), os.environ.get("LRU_CACHE_CAPACITY"))
w = torch.randn(576, 1536, requires_grad=True)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
for m in range(100, 110):  # warm-up: the libraries' own one-off allocations
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (torch.randn(m, 576, requires_grad=True) @ w).float().sum().backward()
r0 = rss()
for m in range(110, 260):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (torch.randn(m, 576, requires_grad=True) @ w).float().sum().backward()
print((rss() - r0) >> 20)
"""


def test_import_bounds_onednn_kernel_caches_unless_the_environment_sets_them():
    from longhaul.malloc import KERNEL_CACHE_ENTRIES

    base = {"PATH": "/usr/bin:/bin", "LONGHAUL_MALLOC": "system", "PYTHONPATH": ":".join(sys.path)}
    run = lambda env: subprocess.run([sys.executable, "-c", KERNELS], capture_output=True, text=True, env=env,  # noqa: E731
                                     timeout=300, check=True).stdout.split()
    *bounded, grew = run(base)
    assert bounded == [str(KERNEL_CACHE_ENTRIES)] * 2
    *theirs, grew_default = run({**base, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"})
    assert theirs == ["1024", "1024"]  # the user's settings stand
    # where bf16 matmuls build oneDNN kernels (hundreds of MB for these shapes at oneDNN's default
    # of 1,024 entries), the bound keeps well under half of that; elsewhere both stay small
    assert int(grew) <= max(0.5 * int(grew_default), 100), (grew, grew_default)


def test_foreign_env_drops_the_kernel_cache_bounds_longhaul_set():
    from longhaul.malloc import foreign_env

    ours = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64", "LONGHAUL_KERNEL_CACHES": "LRU_CACHE_CAPACITY",
            "X": "1"}
    assert foreign_env(ours) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "X": "1"}  # the user set the first one
