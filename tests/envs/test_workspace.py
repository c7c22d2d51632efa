"""The workspace env through its tools, in the real sandbox: every bad input is an observation."""

import subprocess

import pytest

from longhaul.envs.tools import format_call
from longhaul.envs.workspace import HIDDEN_DIR, WorkspaceEnv, WorkspaceLimits, WorkspaceTask
from tests.waiting import wait_until

SRC = "def add(a, b):\n    return a - b\n"
TEST = "from m import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
HIDDEN = "from m import add\n\n\ndef test_hidden():\n    assert add(1, 1) == 2\n"
FIX = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"


def task(**kw):
    base = dict(task_id="t/v1/0", family="t", version="1", seed=0, difficulty=1, subfamily="x", instruction="Fix add in m.py.",
                files={"m.py": SRC, "tests/test_m.py": TEST}, hidden_files={"test_hidden.py": HIDDEN},
                verify_command=f"python3 -m pytest -q -o pythonpath=. {HIDDEN_DIR}",
                setup=("git init -q && git add -A && git commit -qm init",), test_command="python3 -m pytest -q tests")
    base.update(kw)
    return WorkspaceTask(**base)


@pytest.fixture
def env():
    # run_tests and run (default: the max) must finish inside max_timeout_s: room for a loaded machine
    e = WorkspaceEnv(WorkspaceLimits(max_observation_chars=2000, max_write_bytes=10_000, max_timeout_s=60.0))
    yield e
    e.close()


def obs(env, text):
    r = env.step(text)
    return r, "\n".join(o["content"] for o in r.observations)


def test_reset_gives_system_with_tools_and_the_instruction(env):
    messages, info = env.reset(task())
    assert [m["role"] for m in messages] == ["system", "user"]
    system = messages[0]["content"]
    assert "- apply_patch(patch): " in system and "- read_file(path, start_line?, end_line?): " in system
    assert "<tool_call>" in system and messages[1]["content"] == "Fix add in m.py."
    assert info["task_id"] == "t/v1/0"


def test_fix_through_the_tools_passes_and_the_null_agent_fails(env):
    env.reset(task())
    _, out = obs(env, format_call("run_tests"))
    assert "1 failed" in out
    _, out = obs(env, format_call("apply_patch", patch=FIX))
    assert out == "patched m.py"
    _, out = obs(env, format_call("run", command="git diff --stat && ruff check m.py"))
    assert "1 insertion" in out and "All checks passed" in out
    r, _ = obs(env, format_call("submit"))
    assert r.terminated and not r.truncated
    assert env.verify().passed
    env.reset(task())
    obs(env, format_call("submit"))
    s = env.verify()
    assert (s.passed, s.status) == (False, "fail")


def test_hidden_files_never_reach_the_agent_sandbox(env):
    env.reset(task())
    _, out = obs(env, format_call("run", command=f"ls -a; ls {HIDDEN_DIR}; find / -path /proc -prune -o -name 'test_hidd*' -print 2>/dev/null", timeout=60))
    assert "test_hidden" not in out and "No such file" in out


@pytest.mark.parametrize("text, fragment", [
    ("I think the bug is in add.", "No tool call found"),
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    (format_call("delete_everything"), "unknown tool"),
    (format_call("read_file"), "needs the argument 'path'"),
    (format_call("read_file", path="../../etc/passwd"), "leaves the workdir"),
    (format_call("read_file", path="/etc/passwd"), "outside the workdir"),
    (format_call("read_file", path="nope.py"), "does not exist"),
    (format_call("read_file", path="m.py", start_line=0), "not a valid range"),
    (format_call("read_file", path="tests"), "is a directory"),
    (format_call("write_file", path="big.txt", content="x" * 20_000), "over the 10000-byte limit"),
    (format_call("write_file", path="../escape.txt", content="x"), "leaves the workdir"),
    (format_call("apply_patch", patch="not a diff"), "no hunks found"),
    (format_call("apply_patch", patch=FIX.replace("a - b", "a * b")), "does not match"),
    (format_call("list_dir", path="m.py"), "not a directory"),
    (format_call("run", command="sleep 30", timeout=1), "ran past its 1 s timeout"),
    (format_call("run", command="ls", timeout=500), "timeout must be in"),
    (format_call("run", command="yes | head -c 100000"), "characters cut"),
])
def test_bad_calls_become_observations(env, text, fragment):
    env.reset(task())
    r, out = obs(env, text)
    assert fragment in out, out
    assert not r.terminated and not r.truncated
    _, out = obs(env, format_call("read_file", path="m.py"))  # the episode goes on
    assert out == SRC


def test_symlink_escape_is_refused_and_the_shell_survives_exit(env):
    env.reset(task())
    obs(env, format_call("run", command="ln -s /etc/hostname link && cd tests && export X=1"))
    _, out = obs(env, format_call("read_file", path="link"))
    assert "leaves the workdir" in out
    _, out = obs(env, format_call("run", command="pwd; echo $X"))
    assert "/work/tests\n1" in out  # the session keeps cwd and variables
    obs(env, format_call("run", command="exit 3"))
    _, out = obs(env, format_call("run", command="echo alive"))
    assert "alive" in out


def test_calls_per_reply_are_capped_and_submit_stops_the_rest(env):
    env.reset(task())
    five = "".join(format_call("list_dir") for _ in range(5))
    r, out = obs(env, five)
    assert len(r.observations) == 5 and "only 4 tool calls" in r.observations[-1]["content"]
    r, _ = obs(env, format_call("submit") + format_call("write_file", path="after.txt", content="x"))
    assert r.terminated and len(r.observations) == 1


def test_verify_stops_background_processes_and_uses_a_fresh_copy(env):
    env.reset(task())
    obs(env, format_call("apply_patch", patch=FIX))
    # a background writer that would break m.py long after any test, or at once if its sleep were killed before it:
    # verify() must stop the whole tree before killing any of it, and before it copies the workdir
    obs(env, format_call("run", command="(sleep 4321.5; echo 'def add(a, b):\n    return 0' > m.py) & echo started"))
    wait_until(lambda: _host_processes("sleep 4321.5"), what="the agent's background sleep to start")
    s = env.verify()
    assert s.passed
    # nothing the agent started outlives verify() (an odd duration: no other process's `sleep 4321...`); a SIGKILLed
    # process may take a moment to be gone, one that was never stopped would sleep for over an hour
    wait_until(lambda: not _host_processes("sleep 4321.5"), what="the agent's background sleep to be gone")


def _host_processes(args: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if line.strip() == args]


def test_verify_reports_syntax_and_timeouts(env):
    env.reset(task())
    obs(env, format_call("write_file", path="m.py", content="def add(a, b)\n    return a + b\n"))
    assert env.verify().status == "syntax"
    env.reset(task(verify_command="sleep 10", verify_timeout_s=1.0))
    assert env.verify().status == "timeout"


def test_verify_scores_the_exit_status_not_what_the_check_prints(env):
    # a checker whose output contains the texts the sandbox once read as limits still passes on exit 0
    say = "import sys; print('MemoryError'); sys.stderr.write('MemoryError No space left on device File too large')"
    env.reset(task(verify_command=f'python3 -c "{say}"'))
    assert env.verify().status == "pass"
    env.reset(task(verify_command=f'python3 -c "{say}; raise SystemExit(1)"'))
    assert env.verify().status == "fail"


def test_tests_cannot_be_gamed_with_a_conftest_when_the_task_says_so(env):
    # the hidden command decides what it trusts; bugfix runs pytest with --noconftest and its own ini
    cmd = f"python3 -m pytest -q --noconftest -c {HIDDEN_DIR}/pytest.ini -p no:cacheprovider {HIDDEN_DIR}"
    env.reset(task(verify_command=f"PYTHONPATH=/work:$PYTHONPATH {cmd}", hidden_files={"test_hidden.py": HIDDEN, "pytest.ini": "[pytest]\n"}))
    obs(env, format_call("write_file", path="conftest.py", content="import pytest\n\n@pytest.hookimpl(tryfirst=True)\n"
                         "def pytest_runtest_call(item):\n    pass\n"))
    obs(env, format_call("write_file", path="pytest.ini", content="[pytest]\naddopts = -p no:python\n"))
    assert not env.verify().passed


def test_an_error_of_ours_ends_the_episode_as_infra_error(env, monkeypatch):
    env.reset(task())
    monkeypatch.setattr(env, "_tool_list_dir", lambda path=".": 1 / 0)
    r, _ = obs(env, format_call("list_dir"))
    assert r.truncated and "ZeroDivisionError" in r.info["infra_error"]


def test_an_episode_audits_its_commands_and_its_check_under_its_sandbox(tmp_path):
    """Where a run names an audit log (`audit_to`, what `log.audit` does), every command of the
    episode's set-up, of its shell session and of its check is one line there, keyed by the id
    `reset` returns; another episode's lines carry its own."""
    from longhaul.sandbox.audit import AUDIT_ENV, audit_to

    path = tmp_path / "audit.jsonl"
    with audit_to(path):
        e = WorkspaceEnv(WorkspaceLimits(max_timeout_s=60.0))
        try:
            _, info = e.reset(task())
            obs(e, format_call("run", command="echo audited && exit 3"))
            obs(e, format_call("apply_patch", patch=FIX))
            obs(e, format_call("submit"))
            assert e.verify().passed
            _, other = e.reset(task())
        finally:
            e.close()
    assert AUDIT_ENV not in __import__("os").environ  # restored after the block
    rows = [__import__("json").loads(line) for line in path.read_text().splitlines()]
    mine = [r for r in rows if r["sandbox"] == info["sandbox"]]
    assert ["bash", "-c", "git init -q && git add -A && git commit -qm init"] in [r["argv"] for r in mine]
    session = [r for r in mine if r["argv"][0] == "session"]
    assert session and session[0]["argv"][1].endswith("echo audited && exit 3") and session[0]["exit_code"] == 3
    checks = [r for r in rows if r.get("episode") == info["sandbox"]]
    assert checks and all(r["sandbox"] != info["sandbox"] for r in checks)
    assert any("pytest" in " ".join(r["argv"]) for r in checks)
    assert other["sandbox"] != info["sandbox"] and any(r["sandbox"] == other["sandbox"] for r in rows)
