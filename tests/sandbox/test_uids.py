"""Live sandboxes never share a host uid: claims are locks, released by the kernel when their
holder dies."""

import os
import shutil
import subprocess
import sys

import pytest

from longhaul.sandbox.sandbox import Sandbox
from longhaul.sandbox.spec import SandboxSpec
from tests.sandbox import modes

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


HOLD = r'''
import sys
from longhaul.sandbox import Sandbox, SandboxSpec
boxes = [Sandbox(SandboxSpec()) for _ in range(3)]
print(" ".join(str(b.uid) for b in boxes), flush=True)
sys.stdin.read()
for b in boxes:
    b.close()
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="per-sandbox host uids exist only when longhaul runs as root")
def test_live_sandboxes_never_share_a_uid():
    # two callers that are both pid 1 of their own pid namespace (two containers' entrypoints)
    # compute everything from the same pid: their sandboxes must still get different uids
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", HOLD]
    env = modes.env("cgroups")
    holders = [subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        uids = []
        for h in holders:
            line = h.stdout.readline()
            assert line, h.stderr.read()
            uids += line.split()
        with Sandbox(SandboxSpec()) as a, Sandbox(SandboxSpec()) as b:
            uids += [str(a.uid), str(b.uid)]
        assert len(uids) == 8 and len(set(uids)) == 8, uids
    finally:
        for h in holders:
            h.communicate("", timeout=120)


def test_a_uid_claim_is_released_when_its_holder_dies(tmp_path):
    from longhaul.sandbox.uids import UidClaim

    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom pathlib import Path\nfrom longhaul.sandbox.uids import UidClaim\n"
                               f"c = UidClaim.acquire(Path({str(tmp_path)!r}))\nprint(c.uid, flush=True)\nsys.stdin.read()"],
                              env=modes.env("cgroups"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    uid = int(holder.stdout.readline())
    mine = [UidClaim.acquire(tmp_path) for _ in range(5)]
    assert uid not in [c.uid for c in mine] and len({c.uid for c in mine}) == 5
    holder.kill()
    holder.wait()
    import fcntl

    fd = os.open(tmp_path / str(uid), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the dead holder's lock is gone with it
    finally:
        os.close(fd)
    for c in mine:
        c.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(uid)]  # released claims leave no file
