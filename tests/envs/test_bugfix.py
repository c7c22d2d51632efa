"""Bug injection and the repository bug-fix family, through the real agent loop and sandbox."""

import pytest

from longhaul.agent.loop import AgentConfig, ScriptedPolicy, run_episodes
from longhaul.envs import bugfix
from longhaul.envs.mutate import Mutant, enumerate_mutants
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.models.byte_tokenizer import byte_tokenizer

SNIPPET = '''def f(xs, lo=0, strict=False):
    """Docstring 1 < 2 stays."""
    total = 0
    for i in range(1, len(xs)):
        if xs[i] > lo and not strict:
            total += xs[i] * 2
        elif is_ok(xs, lo):
            total -= 1
    return total  # a comment + 1
'''


def test_every_mutation_kind_is_a_one_line_edit_that_compiles():
    ms = enumerate_mutants("m.py", SNIPPET)
    kinds = {m.kind for m in ms}
    assert kinds == {"default", "comparison", "arithmetic", "boolean", "negation", "swapped_args", "off_by_one"}
    for m in ms:
        new = m.apply(SNIPPET)
        compile(new, "m.py", "exec")
        diff = [(a, b) for a, b in zip(SNIPPET.splitlines(), new.splitlines()) if a != b]
        assert len(diff) == 1 and diff[0][0].strip() != diff[0][1].strip()
        assert "Docstring 1 < 2" in new and "# a comment + 1" in new
    edits = {(m.kind, m.old, m.new) for m in ms}
    assert {("comparison", ">", ">="), ("boolean", "and", "or"), ("arithmetic", "+=", "-="), ("arithmetic", "*", "//"),
            ("default", "False", "True"), ("default", "0", "1"), ("swapped_args", "xs, lo", "lo, xs"),
            ("negation", "is_ok(xs, lo)", "not is_ok(xs, lo)")} <= edits
    assert ("off_by_one", "1", "2") in edits and ("off_by_one", "1", "0") in edits


def test_a_mutant_refuses_source_it_was_not_made_from():
    m = Mutant("m.py", 1, 0, 3, "def", "fed", "x")
    with pytest.raises(ValueError, match="does not match"):
        m.apply("class A: pass\n")


def test_the_shipped_catalog_is_current_and_covers_every_project():
    cat = bugfix.catalog()
    assert cat["content_hash"] == bugfix.content_hash(), "projects changed: rebuild with `python -m longhaul.envs.bugfix`"
    assert len(bugfix.projects()) >= 5
    by_project = {p: sum(e["project"] == p for e in cat["mutants"]) for p in bugfix.projects()}
    assert min(by_project.values()) >= 20, by_project
    assert bugfix.distinct_tasks("train") > 0 and bugfix.distinct_tasks("heldout") > 0


def test_tasks_are_deterministic_and_split_by_bug():
    a, b = bugfix.make_task(5), bugfix.make_task(5)
    assert a == b
    train = {(t.subfamily, t.files[t.reference[2].args["patch"].split("\n")[0][6:]]) for t in bugfix.make_split("train", 40)}
    held = {(t.subfamily, t.files[t.reference[2].args["patch"].split("\n")[0][6:]]) for t in bugfix.make_split("heldout", 40)}
    assert not train & held  # held-out bugs never appear in training
    t = bugfix.make_task(3, 1)
    assert t.task_id.startswith(f"bugfix/v1/{t.subfamily}/3") and "tests/test_issue.py" in t.files
    assert f"`{t.reference[1].args['path']}`" in t.instruction
    assert "test_issue.py" in bugfix.make_task(3, 3).instruction and t.reference[1].args["path"] not in bugfix.make_task(3, 3).instruction


@pytest.mark.parametrize("bad, fragment", [
    (dict(split="dev"), "unknown split"), (dict(difficulty=7), "difficulty must be"), (dict(subfamilies=["nope"]), "unknown bugfix"),
])
def test_bad_arguments(bad, fragment):
    kw = dict(split="train", n=1, difficulty=1, subfamilies=None) | bad
    with pytest.raises(ValueError, match=fragment):
        bugfix.make_split(**kw)


def _run(tasks, oracle=True, extra=()):
    tok = byte_tokenizer()
    keys = [f"{i}" for i in range(len(tasks))]
    scripts = {k: ([a.text() for a in t.reference] if oracle else []) + list(extra) + [format_call("submit")]
               for k, t in zip(keys, tasks)}
    return run_episodes(ScriptedPolicy(tok, scripts), tok, lambda t: WorkspaceEnv(), tasks,
                        AgentConfig(max_turns=12, max_tokens=10_000_000), keys=keys)


def test_oracle_fixes_one_bug_per_project_and_the_null_agent_does_not():
    tasks = [bugfix.make_split("train", 1, d, [p])[0] for d, p in zip((1, 2, 3, 1, 2, 3), bugfix.projects())]
    oracle = _run(tasks)
    assert [t.info["status"] for t in oracle] == ["pass"] * len(tasks), [t.info for t in oracle]
    assert all(t.info["tool_calls"] >= 4 for t in oracle)
    null = _run(tasks, oracle=False)
    assert [t.info["status"] for t in null] == ["fail"] * len(tasks)


def test_the_visible_issue_test_fails_before_the_fix_and_git_works():
    t = bugfix.make_split("train", 1)[0]
    env = WorkspaceEnv()
    try:
        env.reset(t)
        out = env.step(format_call("run_tests")).observations[0]["content"]
        assert "failed" in out and "test_issue.py" in out
        out = env.step(format_call("run", command="git log --oneline | wc -l; git status --short | wc -l")).observations[0]["content"]
        assert out.startswith("1\n0\n")
    finally:
        env.close()


def test_gaming_the_tests_does_not_pass():
    t = bugfix.make_split("train", 1)[0]
    cheats = [format_call("write_file", path="tests/test_issue.py", content="def test_ok():\n    pass\n"),
              format_call("write_file", path="conftest.py", content="import pytest\n\n@pytest.hookimpl(tryfirst=True)\n"
                          "def pytest_runtest_call(item):\n    pass\n"),
              format_call("write_file", path="sitecustomize.py", content="import os\nos._exit(0)\n"),
              format_call("write_file", path=".longhaul_hidden/pytest.ini", content="[pytest]\naddopts = --co\n")]
    (traj,) = _run([t], oracle=False, extra=cheats)
    assert traj.info["status"] == "fail"
