"""`longhaul.malloc.keep_freed_memory`: freed buffers stay mapped for reuse; the opt-out."""

import subprocess
import sys

import pytest

# a child process: the setting is process-wide. Like a training step, it allocates and touches
# buffers of several sizes (81 MB in all) and frees them; it prints how much of that memory is
# still resident after the free (MB), and the minor page faults of touching it all again.
CHILD = r"""
from longhaul.malloc import keep_freed_memory
kept = keep_freed_memory()
assert keep_freed_memory() == kept  # idempotent
import torch
def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
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
        assert kept == "False" and int(left) < 20 and int(faults) > 0.5 * (78 << 20) / 4096
