"""`limit_hit` comes from facts the program cannot forge (the watchdog's and the output cap's
records, the ending signal, cgroup counters, a full workdir), never from what it prints; a
command that exits 0 has none."""

import json
import shutil
import subprocess

import pytest

from longhaul.sandbox.sandbox import Sandbox
from longhaul.sandbox.spec import SandboxSpec
from tests.sandbox import modes

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

MB = 1 << 20


TEXTS = ["MemoryError", "No space left on device", "File too large", "Cannot allocate memory",
         "Resource temporarily unavailable", "fork: retry", "Killed", "Terminated"]
FORGED = r'''
import json, sys
from longhaul.sandbox import PythonChecker, Sandbox, SandboxSpec
texts = json.loads(sys.argv[1])
say = "; ".join(f"echo '{t}'; echo '{t}' >&2" for t in texts)
out = {}
with Sandbox(SandboxSpec(wall_s=30)) as sb:
    for code in (0, 1, 3):
        r = sb.exec(["sh", "-c", f"{say}; exit {code}"])
        out[f"exec exit {code}"] = [r.exit_code, r.limit_hit]
    r = sb.exec(["python3", "-c", "raise MemoryError"])
    out["raise MemoryError"] = [r.exit_code, r.limit_hit]
with PythonChecker(SandboxSpec(wall_s=30)) as c:
    prog = "import sys\n" + "".join(f"print({t!r}); print({t!r}, file=sys.stderr)\n" for t in texts)
    r = c.check(prog)
    out["check exit 0"] = [r.exit_code, r.limit_hit]
    r = c.check(prog + "raise SystemExit(1)")
    out["check exit 1"] = [r.exit_code, r.limit_hit]
print(json.dumps(out))
'''


@pytest.mark.parametrize("mode", modes.MODES)
def test_printed_limit_messages_are_not_limits(mode):
    res = _forged(mode)
    assert res == {"exec exit 0": [0, None], "exec exit 1": [1, None], "exec exit 3": [3, None],
                   "raise MemoryError": [1, None], "check exit 0": [0, None], "check exit 1": [1, None]}


def _forged(mode):
    r = subprocess.run(modes.command(mode, ["python", "-c", FORGED, json.dumps(TEXTS)]), env=modes.env(mode),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_full_workdir_is_a_limit_only_when_the_command_fails():
    with Sandbox(SandboxSpec(wall_s=60, disk_bytes=8 * MB, fsize_bytes=64 * MB)) as sb:
        r = sb.exec(["sh", "-c", "head -c 20000000 /dev/zero > /work/big"])
        assert r.exit_code == 1 and r.limit_hit == "fsize", r  # ENOSPC, and the tmpfs is full: a kernel fact
        r = sb.exec(["sh", "-c", "head -c 20000000 /dev/zero > /work/big2; exit 0"])
        assert r.exit_code == 0 and r.limit_hit is None, r
