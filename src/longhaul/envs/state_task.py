"""Workspace tasks decided by the state checker: the shape of the terminal and multistep tasks.

A sub-family builder returns a `Built` (instruction, starting files, the checks of the task's
`spec.json`, and reference tool calls); `build_task` draws the sub-family (`longhaul.envs.kit`)
and packs the result as a `WorkspaceTask` whose hidden files are the checker program
(`state_check.py`, the same for every task) and that spec. `run`, `write`, `read` and `q` write
reference solutions through the tools. What a check means is the checker's business.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from longhaul.envs.kit import check_difficulty, draw
from longhaul.envs.workspace import Action, WorkspaceTask

MAX_TASK_BYTES = 50_000  # all files and hidden files of one task together
# -I: the checker itself never loads the user site (/work/.local), where an agent could plant a
# usercustomize.py or .pth file that exits 0 at start-up; probes that need the user site (an
# installed package) run in a child interpreter and must print the expected JSON.
VERIFY_COMMAND = "python3 -I .longhaul_hidden/check.py"
# The same program for every task; what it checks comes from the task's spec.json (a list of
# checks). It runs in the verify copy's /work and stops at the first failure with exit 1.
CHECKER = (Path(__file__).parent / "state_check.py").read_text(encoding="utf-8")


@dataclass
class Built:
    """What a sub-family builder returns."""

    instruction: str
    files: dict  # path -> str | bytes
    checks: list  # the checks of spec.json, run in order
    reference: tuple  # Actions (submit excluded)
    setup: tuple = ()
    test_command: str | None = None
    check_python: bool = False


def task_id(family: str, version: str, subfamily: str, seed: int, difficulty: int) -> str:
    return f"{family}/v{version}/{subfamily}/{seed}" + (f"-d{difficulty}" if difficulty != 1 else "")


def build_task(family: str, version: str, registry: dict, seed: int, difficulty: int = 1,
               subfamily: str | None = None) -> WorkspaceTask:
    """The task for ``seed``: the sub-family is drawn from the seed unless given."""
    check_difficulty(difficulty)
    rng, sub = draw(registry, seed, subfamily)
    name = sub.name
    b = sub.build(rng, difficulty)
    hidden = {"check.py": CHECKER, "spec.json": json.dumps({"checks": b.checks}, sort_keys=True, indent=1) + "\n"}
    files, setup = dict(b.files), tuple(b.setup)
    size = sum(len(v.encode() if isinstance(v, str) else v) for v in (*files.values(), *hidden.values()))
    if size > MAX_TASK_BYTES:
        raise RuntimeError(f"{family}/{name}/d{difficulty}/{seed}: {size} bytes of files, over {MAX_TASK_BYTES}")
    if not b.reference:
        raise RuntimeError(f"{family}/{name}: no reference actions")
    return WorkspaceTask(task_id=task_id(family, version, name, seed, difficulty), family=family, version=version, seed=seed,
                         difficulty=difficulty, subfamily=name, instruction=b.instruction, files=files,
                         hidden_files=hidden, verify_command=VERIFY_COMMAND, reference=tuple(b.reference),
                         setup=setup, test_command=b.test_command, check_python=b.check_python,
                         verify_timeout_s=30.0)


# ------------------------------------------------------------------ reference tool calls --

def q(s: str) -> str:
    return shlex.quote(s)


def run(command: str) -> Action:
    return Action("run", {"command": command})


def write(path: str, content: str) -> Action:
    return Action("write_file", {"path": path, "content": content})


def read(path: str) -> Action:
    return Action("read_file", {"path": path})
