"""Tests for the ``terminal`` task family: determinism, task shape, bad inputs, the hidden checker
against empty and placeholder outputs, and the oracle passing / the null agent failing every
sub-family at every difficulty through the real agent loop and sandbox."""

import hashlib
import io
import json
import shutil
import tarfile
import zipfile

import pytest

from longhaul.envs import terminal as tm
from longhaul.envs.state_task import CHECKER
from longhaul.envs.wheel import make_wheel
from longhaul.envs.tools import TOOLS, ToolCall, check_arguments, format_call
from longhaul.envs.workspace import Action, WorkspaceTask
from checker_helpers import check, materialize

NAMES = sorted(tm.SUBFAMILIES)
CASES = [(name, d) for name in NAMES for d in tm.DIFFICULTIES]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def _digest(task: WorkspaceTask) -> str:
    h = hashlib.sha256()
    for path in sorted(task.files):
        data = task.files[path]
        h.update(path.encode() + b"\0" + (data.encode() if isinstance(data, str) else data) + b"\0")
    return h.hexdigest()


def _seed(name: str, d: int) -> int:
    return 31 * NAMES.index(name) + 7 * d


# ------------------------------------------------------------------ shape and determinism --

def test_public_constants_and_registry():
    assert tm.FAMILY == "terminal" and tm.VERSION == "1" and tm.DIFFICULTIES == (1, 2, 3)
    assert len(tm.SUBFAMILIES) >= 8 and "wheel_install" in tm.SUBFAMILIES
    assert tm.SPLIT_SEED_BASE == {"train": 0, "heldout": 1_000_000}
    compile(CHECKER, "check.py", "exec")


@pytest.mark.parametrize("name,d", CASES)
def test_task_fields(name, d):
    task = tm.make_task(_seed(name, d), d, name)
    seed = _seed(name, d)
    assert task.task_id == f"terminal/v1/{name}/{seed}" + ("" if d == 1 else f"-d{d}")
    assert (task.family, task.version, task.seed, task.difficulty, task.subfamily) == ("terminal", "1", seed, d, name)
    assert task.verify_command == "python3 -I .longhaul_hidden/check.py"
    assert task.hidden_files["check.py"] == CHECKER and json.loads(task.hidden_files["spec.json"])["checks"]
    assert task.check_python is False and task.prompt == task.instruction and task.instruction
    size = sum(len(v.encode() if isinstance(v, str) else v) for v in (*task.files.values(), *task.hidden_files.values()))
    assert size < 50_000
    assert task.reference and all(isinstance(a, Action) and a.tool in ("run", "write_file") for a in task.reference)
    for a in task.reference:
        assert check_arguments(ToolCall(a.tool, a.args)) is None
        assert a.text() == format_call(a.tool, **a.args)
    assert all(not p.startswith(("/", ".longhaul_hidden")) and ".." not in p.split("/") for p in task.files)


def test_same_seed_same_task_and_different_seeds_differ():
    for name, d in CASES:
        a, b = tm.make_task(5, d, name), tm.make_task(5, d, name)
        assert a == b and _digest(a) == _digest(b)
        assert _digest(tm.make_task(6, d, name)) != _digest(a)
    assert tm.make_split("train", 12, 2) == tm.make_split("train", 12, 2)
    assert tm.make_task(3) == tm.make_split("train", 4)[3]
    assert tm.make_task(1_000_002, 3) == tm.make_split("heldout", 3, 3)[2]


def test_two_hundred_tasks_are_distinct_and_cover_the_family():
    tasks = tm.make_split("train", 200)
    assert len({_digest(t) for t in tasks}) == 200
    assert len({t.task_id for t in tasks}) == 200
    assert {t.subfamily for t in tasks} == set(NAMES)
    held = tm.make_split("heldout", 50)
    assert not {_digest(t) for t in held} & {_digest(t) for t in tasks}


def test_make_split_restricted_to_subfamilies():
    tasks = tm.make_split("train", 30, 2, ["sort_unique", "tar_archive"])
    assert {t.subfamily for t in tasks} == {"sort_unique", "tar_archive"}
    assert all(t.difficulty == 2 and t.task_id.endswith("-d2") for t in tasks)
    assert tm.make_split("heldout", 0) == []


def test_bad_inputs_raise_value_error_naming_valid_choices():
    with pytest.raises(ValueError, match="train"):
        tm.make_split("test", 3)
    with pytest.raises(ValueError, match=r"\(1, 2, 3\)"):
        tm.make_split("train", 3, difficulty=4)
    with pytest.raises(ValueError, match=r"\(1, 2, 3\)"):
        tm.make_task(0, difficulty=0)
    with pytest.raises(ValueError, match="sort_unique"):
        tm.make_task(0, subfamily="nope")
    with pytest.raises(ValueError, match="sort_unique"):
        tm.make_split("train", 3, subfamilies=["nope"])
    with pytest.raises(ValueError):
        tm.make_split("train", 3, subfamilies=[])
    with pytest.raises(ValueError):
        tm.make_split("train", -1)


def test_wheels_are_deterministic_and_well_formed():
    name, data = make_wheel("demokit", "1.2.3", {"demokit/__init__.py": "X = 1\n"}, requires=("democore",))
    assert name == "demokit-1.2.3-py3-none-any.whl"
    assert make_wheel("demokit", "1.2.3", {"demokit/__init__.py": "X = 1\n"}, requires=("democore",))[1] == data
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        assert {"demokit/__init__.py", "demokit-1.2.3.dist-info/METADATA", "demokit-1.2.3.dist-info/WHEEL",
                "demokit-1.2.3.dist-info/RECORD"} <= set(names)
        assert all(zi.date_time == (2024, 1, 1, 0, 0, 0) for zi in zf.infolist())
        assert "Requires-Dist: democore" in zf.read("demokit-1.2.3.dist-info/METADATA").decode()
        record = zf.read("demokit-1.2.3.dist-info/RECORD").decode()
        assert all(n in record for n in names)
    for d in tm.DIFFICULTIES:
        task = tm.make_task(9, d, "wheel_install")
        wheels = [p for p in task.files if p.startswith("wheelhouse/") and p.endswith("-py3-none-any.whl")]
        assert len(wheels) == d  # d2 adds a newer release, d3 a dependency


# ------------------------------------------------------------------ the checker, without a sandbox --

def placeholders(task: WorkspaceTask, root) -> None:
    """Empty or placeholder versions of every output the checks read."""
    for c in json.loads(task.hidden_files["spec.json"])["checks"]:
        path = c.get("path")
        if c["op"] in ("text", "answer") and not (root / path).exists():
            (root / path).write_text("0\n")
        elif c["op"] in ("json", "json_key"):
            (root / path).write_text("{}\n")
        elif c["op"] == "tar":
            with tarfile.open(root / path, "w:gz"):
                pass


@pytest.mark.parametrize("name", NAMES)
def test_checker_rejects_the_start_state_and_placeholders(name, tmp_path):
    for d in tm.DIFFICULTIES:
        task = tm.make_task(_seed(name, d) + 1, d, name)
        root = tmp_path / f"d{d}"
        root.mkdir()
        materialize(task, root)
        r = check(root)
        assert r.returncode == 1 and r.stdout.startswith("FAIL: "), r.stdout + r.stderr
        placeholders(task, root)
        r = check(root)
        assert r.returncode == 1 and r.stdout.startswith("FAIL: "), r.stdout + r.stderr


def test_checker_tree_and_tar_checks_are_exact(tmp_path):
    task = tm.make_task(4, 3, "tar_archive")
    materialize(task, tmp_path)
    members = json.loads(task.hidden_files["spec.json"])["checks"][0]["files"]

    def pack(extra=None, drop=None):
        with tarfile.open(tmp_path / "backup.tar.gz", "w:gz") as tf:
            for name, content in {**members, **(extra or {})}.items():
                if name == drop:
                    continue
                data = content.encode()
                ti = tarfile.TarInfo("./" + name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))

    pack()
    assert check(tmp_path).returncode == 0
    pack(extra={"junk.txt": "x\n"})
    assert "unexpected members" in check(tmp_path).stdout
    pack(drop=min(members))
    assert "missing members" in check(tmp_path).stdout
    pack()
    (tmp_path / "data" / "stray.csv").write_text("a,b\n")  # the originals must stay as they were
    assert "unexpected under data/" in check(tmp_path).stdout


# ------------------------------------------------------------------ oracle and null through the loop --

@pytest.fixture(scope="module")
def loop_results():
    from longhaul.agent.loop import AgentConfig, ScriptedPolicy, run_episodes
    from longhaul.envs.workspace import WorkspaceEnv
    from longhaul.models.byte_tokenizer import byte_tokenizer

    tasks = [tm.make_task(_seed(name, d), d, name) for name, d in CASES]
    runs = tasks + tasks  # first the oracle, then the null agent, on the same tasks
    scripts = {}
    for i, t in enumerate(runs):
        oracle = i < len(tasks)
        scripts[f"{i}:{t.task_id}"] = ([a.text() for a in t.reference] if oracle else []) + [format_call("submit")]
    tok = byte_tokenizer()
    trajs = run_episodes(ScriptedPolicy(tok, scripts), tok, lambda t: WorkspaceEnv(), runs,
                         AgentConfig(max_turns=20, max_tokens=200_000))
    return {case: (trajs[k], trajs[k + len(tasks)], tasks[k]) for k, case in enumerate(CASES)}


@needs_bwrap
@pytest.mark.parametrize("name,d", CASES)
def test_oracle_passes_and_null_agent_fails(loop_results, name, d):
    oracle, null, task = loop_results[(name, d)]
    assert oracle.info["ended"] == "done" and oracle.info["status"] == "pass", (task.task_id, oracle.info)
    assert oracle.reward == 1.0
    assert oracle.info["tool_calls"] == len(task.reference) + 1
    assert null.info["ended"] == "done" and null.info["status"] == "fail", (task.task_id, null.info)
    assert null.reward == 0.0


@needs_bwrap
def test_a_planted_usercustomize_does_not_pass_the_check():
    """An agent that makes every user-site Python exit 0 at start-up still fails (the checker runs with -I)."""
    from longhaul.agent.loop import AgentConfig, ScriptedPolicy, run_episodes
    from longhaul.envs.workspace import WorkspaceEnv
    from longhaul.models.byte_tokenizer import byte_tokenizer

    plant = format_call("run", command="d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$d\" "
                                       "&& echo 'import os; os._exit(0)' > \"$d/usercustomize.py\"")
    tasks = [tm.make_task(2, 1, "sort_unique"), tm.make_task(2, 1, "wheel_install")]
    tok = byte_tokenizer()
    scripts = {f"{i}:{t.task_id}": [plant, format_call("submit")] for i, t in enumerate(tasks)}
    trajs = run_episodes(ScriptedPolicy(tok, scripts), tok, lambda t: WorkspaceEnv(), tasks, AgentConfig(max_turns=5, max_tokens=200_000))
    assert [(tr.info["ended"], tr.reward) for tr in trajs] == [("done", 0.0), ("done", 0.0)]


@pytest.mark.slow
@needs_bwrap
def test_envcheck_over_a_larger_sample(tmp_path):
    """The quality platform over 2 x 102 tasks: the oracle passes and the null agent fails every one, twice."""
    from longhaul.eval.envcheck import run_envcheck

    e = run_envcheck(["terminal"], n=102, manifest=tmp_path / "manifest.json")["families"]["terminal"]
    assert e["status"] == "ok" and e["valid"] == e["checked"] == 204 and e["flaky"] == e["failing"] == []


def test_tools_used_by_references_exist():
    assert {"run", "write_file", "submit"} <= set(TOOLS)
