"""The hidden checker program of the terminal and multistep families (`longhaul/envs/state_check.py`),
run as a program the way verify() runs it (`python3 -I .longhaul_hidden/check.py` in the work
directory), one kind of check at a time on small inputs: each passes on the right state and fails
with exit 1 and a line naming the problem on a wrong one."""

import ast
import io
import json
import os
import sys
import tarfile
from pathlib import Path

from longhaul.envs import state_task, terminal
from checker_helpers import check

PROGRAM = Path(state_task.__file__).parent / "state_check.py"  # read as a file, never imported


def run(root: Path, checks: list, files: dict | None = None):
    """Lay out `files` and the checker with a spec of `checks` under `root`, then run it there."""
    for rel, data in (files or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    hidden = root / ".longhaul_hidden"
    hidden.mkdir(exist_ok=True)
    (hidden / "check.py").write_text(PROGRAM.read_text())
    (hidden / "spec.json").write_text(json.dumps({"checks": checks}))
    return check(root)


def passes(root, checks, files=None):
    r = run(root, checks, files)
    return r.returncode == 0 and r.stdout.strip() == "ok"


def fails(root, checks, files=None, fragment=""):
    r = run(root, checks, files)
    assert r.stderr == "", r.stderr  # a failed check is a verdict, never a crash
    return r.returncode == 1 and r.stdout.startswith("FAIL: ") and fragment in r.stdout


def test_the_tasks_carry_this_program():
    assert state_task.CHECKER == PROGRAM.read_text()
    assert terminal.make_task(0).hidden_files["check.py"] == PROGRAM.read_text()


def test_no_checks_pass_and_an_unknown_check_fails(tmp_path):
    assert passes(tmp_path, [])
    assert fails(tmp_path, [{"op": "nope"}], fragment="unknown check 'nope'")


def test_text_is_exact_up_to_one_final_newline(tmp_path):
    want = [{"op": "text", "path": "out.txt", "expect": "a\nb\n"}]
    assert passes(tmp_path, want, {"out.txt": "a\nb\n"})
    assert passes(tmp_path, want, {"out.txt": "a\nb"})
    assert fails(tmp_path, want, {"out.txt": "a\nb\n\n"}, "does not have the expected content")
    assert fails(tmp_path, want, {"out.txt": "b\na\n"})
    assert fails(tmp_path, want, {"out.txt": b"\xff\xfe"}, "is not UTF-8 text")
    (tmp_path / "out.txt").unlink()
    assert fails(tmp_path, want, fragment="out.txt is missing")


def test_answer_ignores_surrounding_whitespace_only(tmp_path):
    want = [{"op": "answer", "path": "answer.txt", "expect": "42"}]
    assert passes(tmp_path, want, {"answer.txt": "  42\n\n"})
    assert fails(tmp_path, want, {"answer.txt": "4 2\n"}, "does not hold the right answer")


def test_json_and_json_key(tmp_path):
    assert passes(tmp_path, [{"op": "json", "path": "s.json", "expect": {"a": [1, 2]}}], {"s.json": '{ "a": [1, 2] }'})
    assert fails(tmp_path, [{"op": "json", "path": "s.json", "expect": {"a": [2, 1]}}], fragment="expected JSON")
    assert fails(tmp_path, [{"op": "json", "path": "s.json", "expect": {}}], {"s.json": "{oops"}, "not valid JSON")
    key = [{"op": "json_key", "path": "k.json", "key": "n", "expect": 3}]
    assert passes(tmp_path, key, {"k.json": '{"n": 3, "other": 1}'})
    assert fails(tmp_path, key, {"k.json": '{"n": 4}'}, "key 'n'")
    assert fails(tmp_path, key, {"k.json": "[3]"}, "key 'n'")


def test_absent(tmp_path):
    assert passes(tmp_path, [{"op": "absent", "path": "gone.txt"}])
    assert fails(tmp_path, [{"op": "absent", "path": "gone.txt"}], {"gone.txt": ""}, "should not exist")
    os.symlink("nowhere", tmp_path / "dangling")
    assert fails(tmp_path, [{"op": "absent", "path": "dangling"}], fragment="should not exist")


def test_tree_is_exactly_these_files(tmp_path):
    files = {"d/a.txt": "1\n", "d/sub/b.txt": "2\n"}
    want = [{"op": "tree", "root": "d", "files": {"a.txt": "1\n", "sub/b.txt": "2\n"}}]
    assert passes(tmp_path, want, files)
    assert fails(tmp_path, want, {"d/sub/b.txt": "3\n"}, "does not have the expected content")
    assert fails(tmp_path, want, {"d/sub/b.txt": "2\n", "d/c.txt": ""}, "unexpected under d/: c.txt")
    (tmp_path / "d/c.txt").unlink()
    (tmp_path / "d/a.txt").unlink()
    assert fails(tmp_path, want, fragment="missing under d/: a.txt")
    (tmp_path / "d/a.txt").write_text("1\n")
    (tmp_path / "d/.hidden").write_text("")
    assert fails(tmp_path, want, fragment="unexpected under d/: .hidden")
    assert passes(tmp_path, [{**want[0], "skip_hidden": True}])
    os.symlink("sub", tmp_path / "d/link")  # a link to a directory is an entry, not followed
    assert fails(tmp_path, [{**want[0], "skip_hidden": True}], fragment="unexpected under d/: link")
    assert fails(tmp_path, [{"op": "tree", "root": "nodir", "files": {}}], fragment="nodir/ is missing")


def test_mode(tmp_path):
    run(tmp_path, [], {"x.sh": "#!/bin/sh\n", "y.txt": ""})
    (tmp_path / "x.sh").chmod(0o755)
    (tmp_path / "y.txt").chmod(0o644)
    assert passes(tmp_path, [{"op": "mode", "path": "x.sh", "exec": True}, {"op": "mode", "path": "y.txt", "exec": False}])
    assert fails(tmp_path, [{"op": "mode", "path": "y.txt", "exec": True}], fragment="y.txt is not executable")
    assert fails(tmp_path, [{"op": "mode", "path": "x.sh", "exec": False}], fragment="should not be executable")


def _tar(path: Path, members: dict) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for name, content in members.items():
            data = content.encode()
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))


def test_tar_members_are_exact_and_safe(tmp_path):
    want = [{"op": "tar", "path": "b.tar.gz", "files": {"a.csv": "1\n", "s/b.csv": "2\n"}}]
    _tar(tmp_path / "b.tar.gz", {"./a.csv": "1\n", "s/b.csv": "2\n"})
    assert passes(tmp_path, want)
    _tar(tmp_path / "b.tar.gz", {"a.csv": "1\n", "s/b.csv": "3\n"})
    assert fails(tmp_path, want, fragment="member 's/b.csv' does not have the expected content")
    _tar(tmp_path / "b.tar.gz", {"a.csv": "1\n", "s/b.csv": "2\n", "../evil": ""})
    assert fails(tmp_path, want, fragment="absolute or '..' path")
    _tar(tmp_path / "b.tar.gz", {"a.csv": "1\n"})
    assert fails(tmp_path, want, fragment="missing members ['s/b.csv']")
    (tmp_path / "b.tar.gz").write_bytes(b"not a tar")
    assert fails(tmp_path, want, fragment="not a readable .tar.gz archive")


def test_python_probe_compares_its_last_json_line(tmp_path):
    probe = {"op": "python", "what": "the probe", "code": "import json, sys; print('noise'); print(json.dumps({'a': 1, 'b': 2}))"}
    assert passes(tmp_path, [{**probe, "expect": {"a": 1, "b": 2}}])
    assert fails(tmp_path, [{**probe, "expect": {"a": 1, "b": 3}}], fragment="the probe: wrong b")
    assert fails(tmp_path, [{**probe, "code": "print('no json')", "expect": {}}], fragment="printed no JSON")
    assert fails(tmp_path, [{**probe, "code": "raise SystemExit('boom')", "expect": {}}], fragment="probe failed: boom")
    assert fails(tmp_path, [{**probe, "code": "import time; time.sleep(5)", "timeout": 0.5, "expect": {}}],
                 fragment="timed out")


def test_the_probe_gets_the_work_directory_and_runs_beside_the_checker(tmp_path):
    code = "import json, os, sys; print(json.dumps([os.path.realpath(sys.argv[1]), os.path.basename(os.getcwd())]))"
    want = [str(tmp_path.resolve()), ".longhaul_hidden"]
    assert passes(tmp_path, [{"op": "python", "what": "where", "code": code, "expect": want}])


def test_checks_run_in_order_and_stop_at_the_first_failure(tmp_path):
    r = run(tmp_path, [{"op": "answer", "path": "a.txt", "expect": "1"}, {"op": "answer", "path": "b.txt", "expect": "2"}],
            {"a.txt": "0"})
    assert (r.returncode, r.stdout.splitlines()) == (1, ["FAIL: a.txt does not hold the right answer"])


def test_the_program_uses_the_standard_library_only():
    tree = ast.parse(PROGRAM.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)
