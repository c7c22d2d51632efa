"""Tests for the procedurally generated ``funcgen`` task family."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from longhaul.envs import funcgen as fg

SUBFAMILY_NAMES = sorted(fg.SUBFAMILIES)
SEEDS = (0, 1, 2, 7, 123, 1_000_003)
EXAMPLE = re.compile(r"^For example, (?:after `(?P<setup>[^`]*)`, )?"
                     r"`(?P<expr>[^`]*)` should return `(?P<result>[^`]*)`\.$", re.M)


def _null_solution(task):
    if task.reference.startswith("class "):
        return (f"class {task.entry_point}:\n    def __init__(self, *a, **k):\n        pass\n"
                "    def __getattr__(self, name):\n        return lambda *a, **k: None\n")
    return f"def {task.entry_point}(*a, **k):\n    return None\n"


def _tasks(name, difficulty):
    return [fg.make_task(seed, difficulty, name) for seed in SEEDS]


def test_registry_size_and_public_constants():
    assert len(fg.SUBFAMILIES) >= 24
    assert fg.FAMILY == "funcgen" and fg.VERSION == "1"


@pytest.mark.parametrize("difficulty", fg.DIFFICULTIES)
@pytest.mark.parametrize("name", SUBFAMILY_NAMES)
def test_reference_passes_and_null_agent_fails(name, difficulty):
    for task in _tasks(name, difficulty):
        exec(task.reference + "\n" + task.tests, {})
        with pytest.raises(AssertionError):
            exec(_null_solution(task) + "\n" + task.tests, {})


@pytest.mark.parametrize("difficulty", fg.DIFFICULTIES)
@pytest.mark.parametrize("name", SUBFAMILY_NAMES)
def test_task_fields_prompt_and_tests_shape(name, difficulty):
    for task in _tasks(name, difficulty):
        assert task.task_id == f"funcgen/v1/{name}/d{difficulty}/{task.seed}"
        assert (task.family, task.version, task.subfamily, task.difficulty) == ("funcgen", "1", name, difficulty)
        assert task.entry_point in task.prompt and "```python" in task.prompt
        lines = task.prompt.split("\n")
        assert len(lines) == 3 and lines[2] == "Reply with only the code in one ```python block."
        assert lines[0].startswith(("Write a Python function `", "Write a Python class `"))
        assert task.reference.startswith((f"def {task.entry_point}(", f"class {task.entry_point}:"))
        asserts = [line for line in task.tests.splitlines() if line.startswith("assert ")]
        assert 5 <= len(asserts) <= 8
        for node in ast.parse(task.tests).body:
            if isinstance(node, ast.Assert):  # expected value is a plain literal, never None
                expected = ast.literal_eval(node.test.comparators[0])
                assert expected is not None and not isinstance(expected, float)


@pytest.mark.parametrize("difficulty", fg.DIFFICULTIES)
@pytest.mark.parametrize("name", SUBFAMILY_NAMES)
def test_prompt_example_matches_reference(name, difficulty):
    for task in _tasks(name, difficulty):
        match = EXAMPLE.search(task.prompt)
        assert match, task.prompt
        namespace = {}
        exec(task.reference, namespace)
        if match["setup"]:
            exec(match["setup"], namespace)
        assert eval(match["expr"], namespace) == ast.literal_eval(match["result"])


def test_determinism_same_process():
    for seed in (0, 5, 99, 1_000_000):
        for difficulty in fg.DIFFICULTIES:
            assert fg.make_task(seed, difficulty) == fg.make_task(seed, difficulty)


def test_determinism_across_processes():
    code = ("from longhaul.envs import funcgen as fg\n"
            "for t in fg.make_split('train', 40, 2): print(t.task_id, repr(t.prompt), repr(t.tests))\n")
    src = str(Path(fg.__file__).resolve().parents[2])
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONPATH": src, "PYTHONHASHSEED": hs}).stdout for hs in ("1", "2")]
    assert outs[0] == outs[1]
    here = "".join(f"{t.task_id} {t.prompt!r} {t.tests!r}\n" for t in fg.make_split("train", 40, 2))
    assert outs[0] == here


def test_forced_subfamily_matches_drawn_one():
    for seed in range(20):
        task = fg.make_task(seed, 2)
        assert fg.make_task(seed, 2, task.subfamily) == task


def test_splits_are_disjoint_and_seeded():
    train, heldout = fg.make_split("train", 50), fg.make_split("heldout", 50)
    assert [t.seed for t in train] == list(range(50))
    assert [t.seed for t in heldout] == list(range(1_000_000, 1_000_050))
    assert not {t.task_id for t in train} & {t.task_id for t in heldout}
    assert not {t.seed for t in train} & {t.seed for t in heldout}


def test_split_mix_is_balanced():
    counts = {}
    for task in fg.make_split("train", 400):
        counts[task.subfamily] = counts.get(task.subfamily, 0) + 1
    assert len(counts) == len(fg.SUBFAMILIES)
    assert max(counts.values()) <= 4 * 400 / len(fg.SUBFAMILIES)


def test_split_restricted_to_subfamilies():
    pool = ["strings.reverse", "math.gcd"]
    tasks = fg.make_split("heldout", 20, 3, subfamilies=pool)
    assert {t.subfamily for t in tasks} == set(pool)
    assert all(t.difficulty == 3 for t in tasks)


def test_bad_arguments():
    with pytest.raises(ValueError, match="train"):
        fg.make_split("test", 3)
    with pytest.raises(ValueError):
        fg.make_task(0, 4)
    with pytest.raises(ValueError):
        fg.make_task(0, 1, "no.such")
    with pytest.raises(ValueError):
        fg.make_split("train", 3, subfamilies=["no.such"])


def test_does_not_touch_global_rng():
    import random
    random.seed(42)
    expected = random.random()
    random.seed(42)
    fg.make_split("train", 10, 3)
    assert random.random() == expected
