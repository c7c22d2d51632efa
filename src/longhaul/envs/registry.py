"""Task families by name, with their verifiers.

Each family exposes `make_split(split, n, difficulty, subfamilies)` returning tasks with
`task_id`, `prompt` and `family`, `VERSION`, and `score_many(tasks, replies, ...)` returning
one `Score` per reply.
"""

from __future__ import annotations

from types import SimpleNamespace

from functools import partial

from longhaul.envs import echo, funcgen, humaneval
from longhaul.envs.code import extract_code
from longhaul.errors import LonghaulError
from longhaul.sandbox import shared_pool
from longhaul.types import Score


def _funcgen_program(task, reply: str) -> str:
    return extract_code(reply) + "\n\n" + task.tests + "\n"


def score_code(tasks, replies: list[str], timeout_s: float = 5.0, workers: int = 2, build=_funcgen_program) -> list[Score]:
    """Run each reply's program (its code, then the task's hidden tests) in the sandbox's check
    servers; pass iff the check exits 0 within its limits; code that does not compile is "syntax"."""
    programs, scores = [], {}
    for i, (task, reply) in enumerate(zip(tasks, replies)):
        prog = build(task, reply)
        try:
            compile(prog, "<reply>", "exec")
        except (SyntaxError, ValueError):
            scores[i] = Score(0.0, False, "syntax")
            continue
        programs.append((i, prog))
    results = shared_pool(workers).run_many([p for _, p in programs], timeout=timeout_s)
    for (i, _), r in zip(programs, results):
        status = "timeout" if r.limit_hit in ("wall", "cpu") else ("pass" if r.ok else "fail")
        scores[i] = Score(1.0 if r.ok else 0.0, r.ok, status)
    return [scores[i] for i in range(len(replies))]


FAMILIES = {
    "funcgen": SimpleNamespace(module=funcgen, version=funcgen.VERSION, make_split=funcgen.make_split, score_many=score_code,
                               stop=("```\n",)),  # the reply is complete once its code block closes,
    "humaneval": SimpleNamespace(module=humaneval, version=humaneval.VERSION, make_split=humaneval.make_split,
                                 score_many=partial(score_code, build=humaneval.program), stop=()),
    "echo": SimpleNamespace(module=echo, version=echo.VERSION, make_split=echo.make_split, score_many=echo.score_many, stop=()),
}


def get_family(name: str):
    if name not in FAMILIES:
        raise LonghaulError(f"unknown task family {name!r}; choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name]
