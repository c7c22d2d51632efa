"""Per-role rewards of team episodes: functions `(env, task, role) -> float | None`, called after
the team's `verify()` while the episode's workspace still exists, their value kept in the role's
`info["role_reward"]` beside the team reward.

`tests_discriminate` scores a tester: its tests must pass on the task's reference solution and fail
on the task as given. A user's own is `package.module:function` in `Role.reward`. What a trainer
does with these values is not decided here.
"""

from __future__ import annotations

import shlex
from typing import Callable

from longhaul.envs.registry import load_object
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError

_READ_ONLY = ("read_file", "list_dir", "run_tests")  # reference steps that change no file: not replayed


def tests_discriminate(env, task, role: str) -> float | None:
    """The tester's reward: 1.0 when the test files the episode added or changed (`test_*.py`)
    pass on the task's reference solution and fail on the task as given, else 0.0; None where
    the task has no reference solution or the env is not a workspace."""
    if not getattr(task, "reference", None) or not isinstance(env, WorkspaceEnv) or env.sb is None:
        return None
    root = env.sb.workdir
    tests = {}
    for host in sorted(root.rglob("test_*.py")):
        rel = host.relative_to(root).as_posix()
        if any(p.startswith(".") for p in host.relative_to(root).parts):
            continue
        text = host.read_text(errors="replace")
        if task.files.get(rel) != text:
            tests[rel] = text
    if not tests:
        return 0.0
    solved = _tests_pass(env, task, tests, solved=True)
    return float(solved and not _tests_pass(env, task, tests, solved=False))


def _tests_pass(like, task, tests: dict[str, str], solved: bool) -> bool:
    """Whether `tests` pass in a fresh workspace of `task`, with its reference applied or not."""
    env = WorkspaceEnv(like.limits, like.backend)
    try:
        env.reset(task)
        for action in task.reference if solved else ():
            if action.tool not in _READ_ONLY:
                env.step(action.text())
        for path, text in tests.items():
            env.sb.write_file(path, text)
        cmd = "python3 -m pytest -q -p no:cacheprovider " + " ".join(shlex.quote(p) for p in tests)
        return env.sb.exec(["bash", "-c", cmd], timeout=task.verify_timeout_s).ok
    finally:
        env.close()


ROLE_REWARDS = {"tests_discriminate": tests_discriminate}


def role_reward(spec: str) -> Callable:
    """A per-role reward `(env, task, role) -> float | None` by built-in name or package.module:function."""
    if spec in ROLE_REWARDS:
        return ROLE_REWARDS[spec]
    if ":" not in spec:
        raise LonghaulError(f"unknown role reward {spec!r}; choose {', '.join(ROLE_REWARDS)} or name a package.module:function")
    fn = load_object(spec, "role reward")
    if not callable(fn):
        raise LonghaulError(f"role reward {spec!r} is not callable; give a function (env, task, role) -> float")
    return fn

