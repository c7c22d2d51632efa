"""Hostile inputs against the bubblewrap sandbox: each test asserts the exact outcome and that
the host saw no change. The list in ANCHORS.md is the minimum."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from longhaul.sandbox.sandbox import Sandbox, SandboxError
from longhaul.sandbox.spec import SandboxSpec
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed (make test installs it)")

SPEC = SandboxSpec(wall_s=10, cpu_s=2, memory_bytes=128 << 20, pids=32, fsize_bytes=8 << 20, disk_bytes=32 << 20, open_files=64,
                   output_bytes=64 << 10)


@pytest.fixture
def sbx(tmp_path):
    s = Sandbox(SPEC, backend="bwrap", audit=tmp_path / "audit.jsonl")
    yield s
    s.close()


def py(code: str) -> list[str]:
    return ["python3", "-c", code]


def host_pids_matching(text: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]


def test_fork_bomb_hits_pids_and_leaves_nothing(sbx):
    # the shell ends once the bomb's first refused fork is reported (its stderr is read with builtins only),
    # however slowly the bomb grows on a loaded machine: no fixed sleep; it fails, as a program whose
    # fork was refused does (a command that exits 0 has no limit hit, whatever the counters say)
    r = sbx.exec(["sh", "-c", 'bomb() { bomb | bomb & }; { bomb; } 2>&1 | { read -r refused; echo "$refused" >&2; exit 1; }'],
                 timeout=120)
    assert r.limit_hit == "pids", r
    assert sbx.cgroup is None or sbx.cgroup.pids() == []


def test_memory_bomb_hits_memory(sbx):
    r = sbx.exec(py("x = []\nwhile True: x.append(bytearray(16 << 20))"))
    assert r.limit_hit == "memory", r
    assert not r.ok


def test_cpu_loop_hits_cpu(sbx):
    r = sbx.exec(py("while True: pass"), timeout=120)  # a loaded machine takes longer to spend 2 s of CPU
    assert r.limit_hit == "cpu", r
    assert r.cpu_s >= 1.5


def test_sleep_forever_hits_wall_and_nothing_is_left(sbx):
    r = sbx.exec(["sleep", "4242"], timeout=0.5)
    assert r.limit_hit == "wall", r
    wait_until(lambda: host_pids_matching("sleep 4242") == [], what="the sandbox's sleep to be gone")


def test_yes_is_truncated_and_returns_promptly(sbx):
    r = sbx.exec(["yes"], timeout=120)
    assert r.truncated and r.limit_hit == "output", r  # stopped at the cap: never ran on to the wall limit
    assert len(r.stdout) == SPEC.output_bytes


def test_big_file_hits_fsize(sbx):
    r = sbx.exec(["sh", "-c", "head -c 20000000 /dev/zero > /work/big"])
    assert r.limit_hit == "fsize", r


def test_disk_fill_is_capped(sbx):
    r = sbx.exec(["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do head -c 7000000 /dev/zero > /work/f$i || exit 1; done"])
    assert r.limit_hit == "fsize" and r.exit_code != 0, r


def test_writes_to_system_paths_and_outside_fail(sbx):
    marker = f"longhaul-marker-{os.getpid()}"
    r = sbx.exec(["sh", "-c", f"touch /usr/{marker}; echo x >> /etc/passwd; touch /{marker}; touch /tmp/{marker}; echo done"])
    assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr
    assert not Path(f"/usr/{marker}").exists() and not Path(f"/{marker}").exists()
    assert not (Path(tempfile.gettempdir()) / marker).exists()  # the sandbox's /tmp is private


def test_host_secrets_are_invisible(sbx, monkeypatch):
    secret = Path.home() / f".longhaul-secret-{os.getpid()}"
    secret.write_text("TOPSECRET")
    monkeypatch.setenv("LONGHAUL_TEST_SECRET", "TOPSECRET")
    try:
        r = sbx.exec(["sh", "-c", f"cat {secret}; cat /etc/shadow; env; cat /proc/1/environ; ls {Path.home()}"])
        assert "TOPSECRET" not in r.stdout + r.stderr
    finally:
        secret.unlink()


def _listen(family, addr):
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.bind((addr, 0))
    srv.listen(5)
    return srv, srv.getsockname()[1]


@pytest.mark.parametrize("family, addr", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_no_tcp_to_host_loopback(sbx, family, addr):
    try:
        srv, port = _listen(family, addr)
    except OSError:
        pytest.skip(f"host has no {addr}")
    try:
        fam = "AF_INET6" if family == socket.AF_INET6 else "AF_INET"
        r = sbx.exec(py(f"import socket\ns = socket.socket(socket.{fam})\ns.settimeout(2)\ns.connect(('{addr}', {port}))\nprint('CONNECTED')"))
        assert "CONNECTED" not in r.stdout and r.exit_code != 0
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):  # a connection that got through would be waiting in the backlog
            srv.accept()
    finally:
        srv.close()


def test_no_dns(sbx):
    r = sbx.exec(py("import socket\nsocket.getaddrinfo('pypi.org', 443)\nprint('RESOLVED')"))
    assert "RESOLVED" not in r.stdout and r.exit_code != 0


def test_kill_all_stays_inside(sbx):
    bystander = subprocess.Popen(["sleep", "3600"])  # outlives any exec: only a kill could end it
    try:
        r = sbx.exec(["sh", "-c", "sleep 30 & kill -9 -1; echo survived"])
        assert r.exit_code == 0 and "survived" in r.stdout  # the caller is spared, its sleep is not
        assert bystander.poll() is None  # the host process is untouched
        assert sbx.exec(["true"]).ok  # and the sandbox still works
    finally:
        bystander.kill()


def test_symlink_out_of_workdir_is_refused_by_read_file(sbx):
    sbx.exec(["ln", "-s", "/etc/passwd", "/work/link"])
    with pytest.raises(SandboxError, match="leaves the workdir"):
        sbx.read_file("link")
    with pytest.raises(SandboxError):
        sbx.read_file("../../etc/passwd")
    with pytest.raises(SandboxError):
        sbx.write_file("/etc/x", "no")


def test_no_setuid_no_nested_namespaces(sbx):
    r = sbx.exec(["sh", "-c", "unshare -U true && echo NESTED; python3 -c 'import os; os.setuid(0)' && echo ROOT; grep NoNewPrivs /proc/self/status"])
    assert "NESTED" not in r.stdout and "ROOT" not in r.stdout
    assert "NoNewPrivs:\t1" in r.stdout


def test_sigterm_trap_is_killed(sbx):
    r = sbx.exec(["sh", "-c", "trap '' TERM; sleep 4343"], timeout=0.5)
    assert r.limit_hit == "wall"
    wait_until(lambda: host_pids_matching("sleep 4343") == [], what="the sandbox's sleep to be gone")


def test_double_forked_daemon_is_gone_after_exec(sbx):
    r = sbx.exec(["sh", "-c", "(setsid sleep 4444 > /dev/null 2>&1 &) ; echo started"])
    assert r.ok and "started" in r.stdout
    wait_until(lambda: host_pids_matching("sleep 4444") == [], what="the daemon to be gone")


def test_fd_exhaustion_is_contained(sbx):
    r = sbx.exec(py("fs = []\ntry:\n    while True: fs.append(open('/dev/null'))\nexcept OSError as e:\n    print('EMFILE', len(fs))"))
    assert r.ok and "EMFILE" in r.stdout
    assert int(r.stdout.split()[1]) < SPEC.open_files


def test_dev_shm_fill_is_capped(sbx):
    before = shutil.disk_usage("/dev/shm").used
    r = sbx.exec(["sh", "-c", "head -c 7000000 /dev/zero > /dev/shm/a; head -c 7000000 /dev/zero > /dev/shm/b; "
                  "head -c 7000000 /dev/zero > /dev/shm/c; head -c 7000000 /dev/zero > /dev/shm/d; head -c 7000000 /dev/zero > /dev/shm/e"])
    # the full tmpfs lives and dies inside the sandbox's namespace: no host-side fact, so no limit is claimed
    assert r.exit_code != 0 and r.limit_hit is None and "No space left on device" in r.stderr, r
    assert abs(shutil.disk_usage("/dev/shm").used - before) < (16 << 20)


def test_non_utf8_output(sbx):
    r = sbx.exec(["sh", "-c", "printf 'ok\\377\\376\\n'; printf '\\200' >&2"])
    assert r.ok and r.stdout.startswith("ok") and "\ufffd" in r.stdout and "\ufffd" in r.stderr


def test_allow_list_refuses_with_126_and_audits(tmp_path):
    spec = SandboxSpec(allow_commands=("python3",))
    with Sandbox(spec, backend="bwrap", audit=tmp_path / "a.jsonl") as s:
        r = s.exec(["sh", "-c", "echo hi"])
        assert r.exit_code == 126 and "not allowed" in r.stderr
        assert s.exec(["python3", "-c", "print(7)"]).stdout == "7\n"
    rows = [json.loads(l) for l in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["refused"] and rows[0]["exit_code"] == 126
    for key in ("time", "sandbox", "argv", "limits", "exit_code", "limit_hit", "wall_s", "cpu_s", "stdout_bytes", "stdin_sha256"):
        assert key in rows[1]


def test_file_api_round_trip_and_snapshot(sbx):
    sbx.write_file("a/b.txt", "hello")
    assert sbx.exec(["cat", "/work/a/b.txt"]).stdout == "hello"
    d0 = sbx.state_digest()
    tok = sbx.snapshot()
    sbx.exec(["sh", "-c", "echo changed > /work/a/b.txt; touch /work/new"])
    assert sbx.state_digest() != d0
    sbx.restore(tok)
    assert sbx.state_digest() == d0 and sbx.read_file("a/b.txt") == b"hello"


def test_fifos_in_the_workdir_cannot_hang_the_file_api(sbx):
    sbx.exec(["mkfifo", "/work/pipe"])
    sbx.write_file("ok.txt", "fine")
    with pytest.raises(SandboxError, match="not a regular file"):
        sbx.read_file("pipe")
    with pytest.raises((SandboxError, OSError)):
        sbx.write_file("pipe", "x")
    tok = sbx.snapshot()  # returns: the fifo is skipped, not read
    digest = sbx.state_digest()
    sbx.restore(tok)
    assert sbx.read_file("ok.txt") == b"fine" and isinstance(digest, str)


def _limits(sbx) -> dict[str, str]:
    r = sbx.exec(["cat", "/proc/self/limits"])
    assert r.ok, r
    return {line[:26].strip(): line[26:].split()[0] for line in r.stdout.splitlines()[1:]}


@pytest.mark.parametrize("launcher", [True, False], ids=["exec-chain", "preexec"])
def test_commands_start_under_the_rlimits_either_way(tmp_path, monkeypatch, launcher):
    """By the exec chain (sh, prlimit, setpriv: the caller spawns without a preexec function, so
    never forks its own memory) or, where those tools are missing, a preexec function: the same
    rlimits and session inside."""
    from longhaul.sandbox import runner

    if not launcher:
        monkeypatch.setattr(runner, "_launcher_tools", lambda: None)
    elif runner._launcher_tools() is None:
        pytest.skip("sh, prlimit or setpriv is missing: the sandbox uses its preexec function here")
    s = Sandbox(SPEC, backend="bwrap", audit=tmp_path / "audit.jsonl")
    try:
        assert (s.spawn_args(["true"])["preexec_fn"] is None) == launcher
        lim = _limits(s)
        assert lim["Max open files"] == str(SPEC.open_files) and lim["Max file size"] == str(SPEC.fsize_bytes)
        assert lim["Max cpu time"] == str(max(1, int(SPEC.cpu_s + 0.999))) and lim["Max core file size"] == "0"
        if s.uid is not None:
            assert lim["Max processes"] == str(SPEC.pids + 16 if s.cgroup else SPEC.pids)
        r = s.exec(py("import os; print(os.getsid(0) == os.getpid(), os.getuid())"))
        assert r.ok, r
        if s.uid is not None:
            assert r.stdout.split()[1] != "0"  # dropped to the sandbox's uid
        assert s.cgroup is None or s.cgroup.pids() == []
    finally:
        s.close()
