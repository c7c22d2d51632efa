"""Tests for the ``multistep`` task family: determinism, task shape, bad inputs, instructions that
do not give the answer away, the hidden checker against the start state and placeholders, visible
tests that fail at the start, and the oracle (>= 3 tool calls before submit) passing / the null
agent failing every sub-family at every difficulty through the real agent loop and sandbox."""

import hashlib
import json
import shutil

import pytest

from longhaul.envs import multistep as ms
from longhaul.envs.state_task import CHECKER
from longhaul.envs.tools import ToolCall, check_arguments, format_call
from longhaul.envs.workspace import Action, WorkspaceTask
from checker_helpers import check, materialize

NAMES = sorted(ms.SUBFAMILIES)
CASES = [(name, d) for name in NAMES for d in ms.DIFFICULTIES]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def _digest(task: WorkspaceTask) -> str:
    h = hashlib.sha256()
    for path in sorted(task.files):
        data = task.files[path]
        h.update(path.encode() + b"\0" + (data.encode() if isinstance(data, str) else data) + b"\0")
    h.update(repr(task.setup).encode())
    return h.hexdigest()


def _seed(name: str, d: int) -> int:
    return 37 * NAMES.index(name) + 11 * d + 500


def _checks(task):
    return json.loads(task.hidden_files["spec.json"])["checks"]


# ------------------------------------------------------------------ shape and determinism --

def test_public_constants_and_registry():
    assert ms.FAMILY == "multistep" and ms.VERSION == "1" and ms.DIFFICULTIES == (1, 2, 3)
    assert len(ms.SUBFAMILIES) >= 5
    assert ms.SPLIT_SEED_BASE == {"train": 0, "heldout": 1_000_000}


@pytest.mark.parametrize("name,d", CASES)
def test_task_fields(name, d):
    seed = _seed(name, d)
    task = ms.make_task(seed, d, name)
    assert task.task_id == f"multistep/v1/{name}/{seed}" + ("" if d == 1 else f"-d{d}")
    assert (task.family, task.version, task.seed, task.difficulty, task.subfamily) == ("multistep", "1", seed, d, name)
    assert task.verify_command == "python3 -I .longhaul_hidden/check.py" and task.hidden_files["check.py"] == CHECKER
    assert _checks(task)
    size = sum(len(v.encode() if isinstance(v, str) else v) for v in (*task.files.values(), *task.hidden_files.values()))
    assert size < 50_000
    assert len(task.reference) >= 3 and all(isinstance(a, Action) for a in task.reference)
    for a in task.reference:
        assert a.tool != "submit" and check_arguments(ToolCall(a.tool, a.args)) is None
    for c in _checks(task):  # the instruction never carries the answer
        if c["op"] == "answer":
            assert c["expect"] not in task.instruction
    if task.test_command:
        assert task.test_command == "python3 -m pytest -q -o pythonpath=. tests"


def test_some_subfamilies_have_visible_tests():
    with_tests = {name for name in NAMES if ms.make_task(1, 1, name).test_command}
    assert {"fix_constant", "fix_config_path"} <= with_tests
    assert ms.make_task(1, 2, "fix_constant").check_python is True


def test_same_seed_same_task_and_different_seeds_differ():
    for name, d in CASES:
        a, b = ms.make_task(8, d, name), ms.make_task(8, d, name)
        assert a == b and _digest(a) == _digest(b)
        assert _digest(ms.make_task(9, d, name)) != _digest(a)
    assert ms.make_split("heldout", 10, 3) == ms.make_split("heldout", 10, 3)
    assert ms.make_task(2, 2) == ms.make_split("train", 3, 2)[2]


def test_two_hundred_tasks_are_distinct_and_cover_the_family():
    tasks = ms.make_split("train", 200)
    assert len({_digest(t) for t in tasks}) == 200
    assert len({t.task_id for t in tasks}) == 200
    assert {t.subfamily for t in tasks} == set(NAMES)


def test_make_split_restricted_to_subfamilies():
    tasks = ms.make_split("heldout", 20, 3, ["pointer_chain"])
    assert {t.subfamily for t in tasks} == {"pointer_chain"}
    assert [t.seed for t in tasks] == list(range(1_000_000, 1_000_020))


def test_bad_inputs_raise_value_error_naming_valid_choices():
    with pytest.raises(ValueError, match="heldout"):
        ms.make_split("valid", 2)
    with pytest.raises(ValueError, match=r"\(1, 2, 3\)"):
        ms.make_split("train", 2, difficulty=5)
    with pytest.raises(ValueError, match=r"\(1, 2, 3\)"):
        ms.make_task(1, difficulty=-1)
    with pytest.raises(ValueError, match="pointer_chain"):
        ms.make_task(1, subfamily="sort_unique")  # a terminal sub-family is not one of this family
    with pytest.raises(ValueError, match="pointer_chain"):
        ms.make_split("train", 2, subfamilies=["pointer_chain", "bogus"])
    with pytest.raises(ValueError):
        ms.make_split("train", -3)


# ------------------------------------------------------------------ the checker, without a sandbox --

@pytest.mark.parametrize("name", NAMES)
def test_checker_rejects_the_start_state_and_placeholders(name, tmp_path):
    for d in ms.DIFFICULTIES:
        task = ms.make_task(_seed(name, d) + 3, d, name)
        root = tmp_path / f"d{d}"
        root.mkdir()
        materialize(task, root)
        r = check(root)
        assert r.returncode == 1 and r.stdout.startswith("FAIL: "), r.stdout + r.stderr
        for c in _checks(task):
            p = root / c["path"] if "path" in c else None
            if c["op"] in ("answer", "text") and not p.exists():
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text("0\n")
            elif c["op"] == "json_key":
                p.write_text("{}\n")
        r = check(root)
        assert r.returncode == 1 and r.stdout.startswith("FAIL: "), r.stdout + r.stderr


def test_answer_check_ignores_surrounding_whitespace_only(tmp_path):
    task = ms.make_task(3, 2, "pointer_chain")
    materialize(task, tmp_path)
    secret = _checks(task)[0]["expect"]
    (tmp_path / "answer.txt").write_text(f"  {secret}\n\n")
    assert check(tmp_path).returncode == 0
    (tmp_path / "answer.txt").write_text(f"secret: {secret}\n")
    assert check(tmp_path).returncode == 1


# ------------------------------------------------------------------ through the env and the loop --

@needs_bwrap
def test_visible_tests_fail_at_the_start():
    from longhaul.envs.workspace import WorkspaceEnv

    env = WorkspaceEnv()
    try:
        for name in ("fix_constant", "fix_config_path"):
            for d in ms.DIFFICULTIES:
                env.reset(ms.make_task(_seed(name, d), d, name))
                out = env.step({"role": "assistant", "content": format_call("run_tests")}).observations[0]["content"]
                assert "failed" in out and "[exit code 1]" in out, out
    finally:
        env.close()


@pytest.fixture(scope="module")
def loop_results():
    from longhaul.agent.loop import AgentConfig, ScriptedPolicy, run_episodes
    from longhaul.envs.workspace import WorkspaceEnv
    from longhaul.models.byte_tokenizer import byte_tokenizer

    tasks = [ms.make_task(_seed(name, d), d, name) for name, d in CASES]
    runs = tasks + tasks  # first the oracle, then the null agent, on the same tasks
    scripts = {f"{i}:{t.task_id}": ([a.text() for a in t.reference] if i < len(tasks) else []) + [format_call("submit")]
               for i, t in enumerate(runs)}
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
    assert oracle.info["tool_calls"] - 1 >= 3  # at least three calls before submit
    assert oracle.info["tool_calls"] == len(task.reference) + 1
    assert null.info["ended"] == "done" and null.info["status"] == "fail", (task.task_id, null.info)
    assert null.reward == 0.0


@pytest.mark.slow
@needs_bwrap
def test_envcheck_over_a_larger_sample(tmp_path):
    """The quality platform over 2 x 102 tasks: the oracle passes and the null agent fails every one, twice."""
    from longhaul.eval.envcheck import run_envcheck

    e = run_envcheck(["multistep"], n=102, manifest=tmp_path / "manifest.json")["families"]["multistep"]
    assert e["status"] == "ok" and e["valid"] == e["checked"] == 204 and e["flaky"] == e["failing"] == []