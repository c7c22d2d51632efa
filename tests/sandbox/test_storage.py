"""Only size-capped mounts are writable inside (a read-only root and /dev; /work, /tmp and
/dev/shm each a tmpfs of `disk_bytes`), so `--disk` bounds what a program can store, with and
without cgroups and as an unprivileged user (see `modes.py`)."""

import json
import shutil

import pytest

from longhaul.sandbox.sandbox import Sandbox
from longhaul.sandbox.spec import SandboxSpec
from tests.sandbox import modes

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

MB = 1 << 20


# every mount a program could create files in: writable (not MS_RDONLY) directories whose
# filesystem stores data (procfs, devpts and the like hold none)
WRITABLE_MOUNTS = r'''
import json, os
PSEUDO = {"proc", "devpts", "sysfs", "mqueue", "cgroup", "cgroup2", "binfmt_misc"}
out = []
for line in open("/proc/self/mountinfo"):
    left, _, right = line.partition(" - ")
    point, fstype = left.split()[4], right.split()[0]
    if fstype in PSEUDO or not os.path.isdir(point):
        continue
    st = os.statvfs(point)
    if not st.f_flag & os.ST_RDONLY:
        out.append([point, fstype, st.f_blocks * st.f_frsize])
print(json.dumps(out))
'''

# tries to store `n` bytes in each directory, reports what it managed
FILL = r'''
import json, os, sys
n, got = int(sys.argv[1]), {}
for d in sys.argv[2:]:
    wrote = 0
    try:
        with open(os.path.join(d, "fill"), "wb") as f:
            while wrote < n:
                wrote += f.write(b"x" * (1 << 20))
                f.flush()
    except OSError:
        pass
    try:
        got[d] = os.path.getsize(os.path.join(d, "fill"))
    except OSError:
        got[d] = 0
print(json.dumps(got))
'''
FILL_DIRS = ["/", "/etc", "/root", "/dev", "/var", "/home", "/run", "/opt", "/usr", "/proc", "/tmp", "/dev/shm", "/work"]


@pytest.mark.parametrize("mode", modes.MODES)
def test_only_capped_mounts_are_writable(mode):
    res = modes.cli_json(mode, "--disk", "16", "--", "python3", "-c", WRITABLE_MOUNTS)
    assert res["exit_code"] == 0, res
    writable = {point: size for point, _, size in json.loads(res["stdout"])}
    assert {"/tmp", "/dev/shm", "/work"} <= set(writable) and "/" not in writable and "/dev" not in writable, writable
    uncapped = {p: s for p, s in writable.items() if s > 16 * MB}
    if mode == "unprivileged":
        # documented: without root the workdir is a host directory (no tmpfs can be mounted for it)
        assert set(uncapped) <= {"/work"}, writable
    else:
        assert uncapped == {} and set(writable) == {"/tmp", "/dev/shm", "/work"}, writable


@pytest.mark.parametrize("mode", ["cgroups", "no-cgroups"])
def test_disk_holds_with_and_without_cgroups(mode):
    # 600 MiB offered to every directory, with a 16 MiB disk and 256 MiB of memory
    res = modes.cli_json(mode, "--mem", "256", "--disk", "16", "--fsize", "1024", "--wall", "120", "--",
                         "python3", "-c", FILL, str(600 * MB), *FILL_DIRS)
    assert res["exit_code"] == 0 and res["limit_hit"] is None, res
    got = json.loads(res["stdout"])
    assert all(got[d] == 0 for d in FILL_DIRS if d not in ("/tmp", "/dev/shm", "/work")), got
    assert all(got[d] <= 16 * MB for d in ("/tmp", "/dev/shm", "/work")), got


def test_device_nodes_still_work_on_the_read_only_dev():
    with Sandbox(SandboxSpec(wall_s=30)) as sb:
        r = sb.exec(["sh", "-c", "echo x > /dev/null && head -c 4 /dev/zero | wc -c && head -c 4 /dev/urandom | wc -c"])
        assert r.ok and r.stdout.split() == ["4", "4"], r


# writes 1 MiB at a time into each directory given, printing the running total after each write
GROW = r'''
import os, sys
n = int(sys.argv[1])
with open(os.path.join(sys.argv[2], "grow"), "wb") as f:
    wrote = 0
    while wrote < n:
        wrote += f.write(b"x" * (1 << 20))
        f.flush()
        print(wrote, flush=True)
'''

SESSION = r'''
import json, sys
from longhaul.sandbox.sandbox import Sandbox
from longhaul.sandbox.spec import SandboxSpec
out = {}
with Sandbox(SandboxSpec(disk_bytes=16 << 20, fsize_bytes=1 << 30, wall_s=60)) as sbx:
    out["watched"] = sbx.storage_watch() is not None
    sbx.write_file("grow.py", sys.argv[1])
    s = sbx.open_session()
    r = s.run("python3 grow.py 629145600 /work/big")
    out["session"] = [r.limit_hit, r.stdout.split()[-1:]]
    r = s.run("rm -f /work/big/grow && echo ok")  # cleaning up within the cap is allowed
    out["after"] = [r.limit_hit, r.stdout.strip()]
    r = sbx.exec(["python3", "grow.py", "629145600", "/work"])
    out["exec"] = [r.limit_hit, r.stdout.split()[-1:]]
print(json.dumps(out))
'''


def test_an_unprivileged_workdir_is_watched_and_a_command_stopped_past_the_cap():
    """As an unprivileged user the workdir is a host directory: the runner measures what it stores
    and stops the command (limit_hit fsize, from its own measurement) long before 600 MiB."""
    res = modes.cli_json("unprivileged", "--disk", "16", "--fsize", "1024", "--wall", "120", "--",
                         "python3", "-c", GROW, str(600 * MB), "/work")
    assert res["limit_hit"] == "fsize" and res["exit_code"] != 0, res
    stored = int(res["stdout"].split()[-1])
    assert 16 * MB < stored < 600 * MB, stored
    got = modes.script("unprivileged", SESSION.replace("sys.argv[1]", repr(GROW)).replace("/work/big", "/work"))
    assert got["watched"] and got["session"][0] == "fsize" and int(got["session"][1][0]) < 600 * MB, got
    assert got["after"] == [None, "ok"], got
    assert got["exec"][0] == "fsize" and int(got["exec"][1][0]) < 600 * MB, got
