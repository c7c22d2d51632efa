import asyncio
import gc
import os
import shutil

import pytest

from longhaul.sandbox.checker import PythonChecker
from longhaul.sandbox.pool import SandboxPool
from longhaul.sandbox.sandbox import Sandbox
from longhaul.sandbox.spec import SandboxSpec

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def test_session_keeps_cwd_and_env_and_survives_interrupt():
    with Sandbox(SandboxSpec(wall_s=5)) as sb:
        s = sb.open_session()
        assert s.run("mkdir -p /work/d && cd /work/d && export FOO=bar").exit_code == 0
        r = s.run("pwd; echo $FOO; printf tail")
        assert r.stdout == "/work/d\nbar\ntail"
        r = s.run("sleep 100", timeout=0.5)
        assert r.limit_hit == "wall"
        assert s.run("pwd; false").stdout == "/work/d\n"
        assert s.run("cat").exit_code == 0  # stdin is /dev/null, not the command stream
        s.close()


def test_session_reports_a_broken_command_at_once_and_keeps_its_state():
    """An unterminated quote or block is a syntax error from the shell (status 2), not a shell
    waiting for the rest of its input until the timeout; quotes, heredocs and several lines run."""
    with Sandbox(SandboxSpec(wall_s=60)) as sb:
        s = sb.open_session()
        assert s.run("cd /tmp && export FOO=\"it's\"").exit_code == 0
        for broken in ("echo \"unterminated", "grep 'x", "if true; then echo a", "echo $(date"):
            r = s.run(broken, timeout=30)
            assert r.limit_hit is None and r.exit_code == 2, (broken, r)
            assert "unexpected" in r.stderr or "syntax" in r.stderr, r.stderr
        r = s.run("cat <<'EOF' > f.txt\nline 'one'\n$FOO\nEOF\necho \"$(wc -l < f.txt) $FOO\"\npwd", timeout=30)
        assert r.exit_code == 0 and r.stdout == "2 it's\n/tmp\n", r
        assert s.run("cat f.txt").stdout == "line 'one'\n$FOO\n"
        s.close()


def test_session_exit_after_output_reports_the_status_and_audits_it(tmp_path):
    """`exit N` ends the shell before its end marker: the status is the shell's, the output is
    kept, and the command is one audit line marked as a session command."""
    with Sandbox(SandboxSpec(), audit=tmp_path / "audit.jsonl") as sb:
        s = sb.open_session()
        r = s.run("echo bye && exit 4")
        assert r.exit_code == 4 and r.stdout.strip() == "bye", r
        s.close()
    import json

    rows = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["argv"], r["exit_code"], r["sandbox"]) for r in rows] == [(["session", "echo bye && exit 4"], 4, sb.id)]


def test_pool_bounds_resets_and_reports():
    async def main():
        pool = SandboxPool(2, SandboxSpec(wall_s=5))
        try:
            async def job(i):
                async with pool.sandbox() as sb:
                    r = await asyncio.to_thread(sb.exec, ["sh", "-c", f"ls /work; echo {i} > /work/f{i}"])
                    return r.stdout
            listings = await asyncio.gather(*(job(i) for i in range(6)))
            assert all(out == "" for out in listings)  # every job saw a clean workdir
            assert len(pool._all) == 2
            r = await pool.exec(["true"])
            assert r.ok
            m = pool.metrics()
            assert m["in_use"] == 0 and m["execs"] == 1 and m["exec_latency_p50_s"] > 0
        finally:
            pool.close()
    asyncio.run(main())


def test_checker_runs_checks_and_survives_a_memory_bomb():
    with PythonChecker(SandboxSpec(cpu_s=2, memory_bytes=128 << 20)) as c:
        assert c.check("print('hi')").stdout == "hi\n"
        assert c.check("assert 1 == 2").exit_code == 1
        assert c.check("import time\ntime.sleep(30)", timeout=1).limit_hit == "wall"
        assert c.check("x = []\nwhile True: x.append(bytearray(1 << 24))").limit_hit == "memory"
        assert c.check("print(sum(range(10)))").stdout == "45\n"


def _counts():
    gc.collect()  # earlier tests' garbage (sockets, pipes) must not close fds mid-count
    fds = len(os.listdir("/proc/self/fd"))
    kids = sum(1 for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == os.getpid())
    return {"fds": fds, "children": kids}


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _many_execs(n):
    Sandbox(SandboxSpec()).close()  # one-time set-up (exposed interpreter mount) before counting
    before = _counts()
    roots = []
    with Sandbox(SandboxSpec(wall_s=5)) as sb:
        roots.append(sb.root)
        for i in range(n):
            r = sb.exec(["sh", "-c", "echo $$ > /dev/null; (sleep 30 &)"] if i % 10 == 0 else ["true"])
            assert r.exit_code == 0
    for _ in range(3):
        s = Sandbox(SandboxSpec())
        roots.append(s.root)
        s.exec(["true"])
        s.close()
    after = _counts()
    # other tests' threads in this process (clients, servers) open and close their own descriptors
    # meanwhile: a leak here would grow with n, so a drift of one or two is theirs
    assert after["fds"] - before["fds"] <= 2 and after["children"] == before["children"], (before, after)
    # the host's mounts and temporary directories are shared with every other job on the machine
    # (a pipeline's sandboxes come and go meanwhile): what must be gone are these sandboxes' own
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    for root in roots:
        assert not root.exists(), f"{root} left behind"
        assert str(root) not in mounts, f"a mount under {root} left behind"


def test_hundreds_of_execs_leak_nothing():
    _many_execs(200)


@pytest.mark.slow
def test_thousands_of_execs_leak_nothing():
    _many_execs(3000)


def test_checker_audits_every_check(tmp_path):
    import json

    with PythonChecker(SandboxSpec(), audit=tmp_path / "audit.jsonl") as c:
        c.check("print(1)")
        c.check("raise SystemExit(4)")
    rows = [json.loads(l) for l in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["exit_code"] for r in rows] == [0, 4]
    assert all(r["argv"] == ["python-check"] and r["stdin_sha256"] for r in rows)
