from longhaul.envs import get_family
from longhaul.envs.code import extract_code
from longhaul.envs.funcgen import make_task


def test_extract_code_variants():
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```python\ndef f(): pass") == "def f(): pass"  # unclosed final block
    assert extract_code("def f(): return 2") == "def f(): return 2"


def test_score_reference_null_and_syntax():
    fam = get_family("funcgen")
    task = make_task(3)
    null = f"def {task.entry_point}(*a, **k):\n    return None\n"
    replies = [f"```python\n{task.reference}\n```", f"```python\n{null}```", "```python\ndef (:\n```",
               "```python\nwhile True: pass\n```"]
    # the three that must finish get room for a loaded machine; only the endless loop meets the short limit
    scores = fam.score_many([task] * 3, replies[:3], timeout_s=60.0) + fam.score_many([task], replies[3:], timeout_s=1.0)
    assert [s.status for s in scores] == ["pass", "fail", "syntax", "timeout"]
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 0.0]


def test_echo_reward_is_dense():
    fam = get_family("echo")
    task = fam.make_split("train", 1)[0]
    s = fam.score_many([task, task, task], [task.target, task.target[:2], "zzzz"])
    assert s[0].passed and s[0].reward == 1.0
    assert 0 < s[1].reward < 1 and s[2].reward < s[1].reward


def test_humaneval_canonical_pass_and_empty_bodies_fail():
    fam = get_family("humaneval")
    tasks = fam.make_split("heldout", 164)
    assert len(tasks) == 164 and len({t.task_id for t in tasks}) == 164
    good = [f"```python\n{t.reference}\n```" for t in tasks]
    empty = [f"```python\n{t.problem_prompt}    pass\n```" for t in tasks]
    assert all(s.passed for s in fam.score_many(tasks, good, timeout_s=10.0))
    assert not any(s.passed for s in fam.score_many(tasks, empty, timeout_s=10.0))


def test_humaneval_is_evaluation_only():
    import pytest

    with pytest.raises(ValueError, match="evaluation only"):
        get_family("humaneval").make_split("train", 1)


def test_a_correct_reply_that_prints_limit_messages_still_scores():
    # what a program prints is not a kernel fact: a reference that also prints the texts the sandbox
    # once read as limits (MemoryError, ENOSPC, EFBIG) passes; the same reply that then fails, fails
    fam = get_family("funcgen")
    task = make_task(3)
    say = "import sys\nprint('MemoryError')\nsys.stderr.write('MemoryError\\nNo space left on device\\nFile too large\\n')\n"
    replies = [f"```python\n{task.reference}\n{say}```", f"```python\n{task.reference}\n{say}raise SystemExit(1)\n```"]
    scores = fam.score_many([task] * 2, replies, timeout_s=60.0)
    assert [s.status for s in scores] == ["pass", "fail"]
