"""Task families by name, with their verifiers.

Each family exposes `make_split(split, n, difficulty, subfamilies)` returning tasks with
`task_id`, `prompt` and `family`, `VERSION`, and `score_many(tasks, replies, ...)` returning
one `Score` per reply.
"""

from __future__ import annotations

from types import SimpleNamespace

from longhaul.envs import echo, funcgen
from longhaul.envs.code import extract_code
from longhaul.errors import LonghaulError
from longhaul.sandbox import shared_pool
from longhaul.types import Score


def score_code(tasks, replies: list[str], timeout_s: float = 5.0, workers: int = 2) -> list[Score]:
    """Run each reply's code followed by its task's hidden tests in the sandbox's check servers;
    pass iff the check exits 0 within its limits."""
    programs, scores = [], {}
    for i, (task, reply) in enumerate(zip(tasks, replies)):
        code = extract_code(reply)
        try:
            compile(code, "<reply>", "exec")
        except (SyntaxError, ValueError):
            scores[i] = Score(0.0, False, "syntax")
            continue
        programs.append((i, code + "\n\n" + task.tests + "\n"))
    results = shared_pool(workers).run_many([p for _, p in programs], timeout=timeout_s)
    for (i, _), r in zip(programs, results):
        status = "timeout" if r.limit_hit in ("wall", "cpu") else ("pass" if r.ok else "fail")
        scores[i] = Score(1.0 if r.ok else 0.0, r.ok, status)
    return [scores[i] for i in range(len(replies))]


FAMILIES = {
    "funcgen": SimpleNamespace(module=funcgen, version=funcgen.VERSION, make_split=funcgen.make_split, score_many=score_code,
                               stop=("```\n",)),  # the reply is complete once its code block closes,
    "echo": SimpleNamespace(module=echo, version=echo.VERSION, make_split=echo.make_split, score_many=echo.score_many, stop=()),
}


def get_family(name: str):
    if name not in FAMILIES:
        raise LonghaulError(f"unknown task family {name!r}; choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name]
