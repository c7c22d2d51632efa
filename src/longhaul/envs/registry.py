"""Task families by name, built-in and user-supplied, behind one `Family` record.

A family makes deterministic tasks from seeds (`make_split(split, n, difficulty, subfamilies)`)
and is one of two kinds:
- `answer`: single-turn; the reply is the answer (a fenced code block for code families) and
  `score_many(tasks, replies) -> [Score]` decides it. The env is `AnswerEnv`.
- `workspace`: multi-turn; tasks are `WorkspaceTask`s run in `WorkspaceEnv` (or a user env) with
  tools, and `verify()` decides.
`reference_reply` / `null_reply` (answer kind) and `WorkspaceTask.reference` (workspace kind) are
what the quality checks (`longhaul envcheck`) replay. User families, envs and reward functions
load from `package.module:Name` (see docs/custom-tasks.md); they pass the same validation.
A family's `content_hash` covers every module and data file its modules import or name
(`longhaul.envs.sources`), so envcheck's record of it goes stale when any of them changes.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

from longhaul.envs import echo, funcgen, humaneval, niah
from longhaul.envs.code import extract_code
from longhaul.envs.sources import content_hash, family_sources
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


def _fence(code: str) -> str:
    return "```python\n" + code.rstrip("\n") + "\n```"


def _stub(code: str) -> str:
    """`code` with every function and class body replaced by `pass`: the do-nothing answer."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body = [ast.Pass()]
        elif isinstance(node, ast.ClassDef):
            node.body = [ast.Pass()]
    return ast.unparse(tree)


@dataclass
class Family:
    name: str
    version: str
    kind: str  # "answer" or "workspace"
    make_split: Callable
    subfamilies: tuple = ()
    difficulties: tuple = (1,)
    splits: tuple = ("train", "heldout")
    score_many: Callable | None = None  # answer kind
    reference_reply: Callable | None = None  # answer kind: task -> a reply that must pass
    null_reply: Callable = lambda task: ""  # answer kind: task -> a reply that must fail
    stop: tuple = ()  # stop strings of an answer
    make_env: Callable | None = None  # workspace kind: task -> Env (default WorkspaceEnv)
    modules: tuple = ()  # dotted names whose imports and data define the family version
    fixed_set: bool = False  # a fixed benchmark (HumanEval): envcheck always checks all of it
    demo_scripts: Callable | None = None  # workspace kind: (task, variant, rng) -> a demonstration in its own tools (agent.demos)
    render_episode: Callable | None = None  # workspace kind: (task, messages, out) -> a PNG of what an episode made (reports)

    def sources(self) -> dict[str, Path]:
        """`{label: file}` of every module and data file the family's modules depend on."""
        return family_sources(self.modules)

    def content_hash(self) -> str:
        return content_hash(self.name, self.version, self.modules)


_ANSWER = {
    "funcgen": Family("funcgen", funcgen.VERSION, "answer", funcgen.make_split, tuple(sorted(funcgen.SUBFAMILIES)),
                      funcgen.DIFFICULTIES, score_many=score_code, reference_reply=lambda t: _fence(t.reference),
                      null_reply=lambda t: _fence(_stub(t.reference)), stop=("```\n",),  # complete once its block closes
                      modules=(funcgen.__name__,)),
    "humaneval": Family("humaneval", humaneval.VERSION, "answer", humaneval.make_split, (), (1,), ("heldout",),
                        score_many=partial(score_code, build=humaneval.program), reference_reply=lambda t: _fence(t.reference),
                        null_reply=lambda t: _fence("    pass"), modules=(humaneval.__name__,), fixed_set=True),
    "echo": Family("echo", echo.VERSION, "answer", echo.make_split, (), (1, 2, 3), score_many=echo.score_many,
                   reference_reply=lambda t: t.target, modules=(echo.__name__,)),
    "niah": Family("niah", niah.VERSION, "answer", niah.make_split, niah.SUBFAMILIES, (1,), ("heldout",),
                   score_many=niah.score_many, reference_reply=niah.reference_reply, null_reply=niah.null_reply,
                   modules=(niah.__name__,)),
}
_WORKSPACE = ("bugfix", "terminal", "multistep", "scene3d")  # modules of longhaul.envs, imported on first use


def families() -> dict[str, Family]:
    """Every built-in family by name (answer families first)."""
    out = dict(_ANSWER)
    for name in _WORKSPACE:
        out[name] = _workspace_family(name)
    return out


def _workspace_family(name: str) -> Family:
    mod = importlib.import_module(f"longhaul.envs.{name}")
    return Family(mod.FAMILY, mod.VERSION, "workspace", mod.make_split, tuple(mod.SUBFAMILIES), tuple(mod.DIFFICULTIES),
                  make_env=getattr(mod, "make_env", None), demo_scripts=getattr(mod, "demo_scripts", None),
                  render_episode=getattr(mod, "render_episode", None), modules=(mod.__name__,))


def load_object(spec: str, what: str):
    """`package.module:Name` -> the object, with one-line errors naming the fix."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise LonghaulError(f"{what} {spec!r} is not of the form package.module:Name")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise LonghaulError(f"cannot import module {mod_name!r} for {what} {spec!r} ({e}); is it on PYTHONPATH?") from e
    try:
        obj = mod
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise LonghaulError(f"module {mod_name!r} has no {attr!r} (for {what} {spec!r})") from None
    return obj


def _attr(obj, name, default=None):
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


def family_from_object(obj, spec: str) -> Family:
    """Validate a user family (a module, class or object with the built-ins' attributes)."""
    missing = [n for n in ("FAMILY", "VERSION", "make_split") if _attr(obj, n) is None]
    if missing:
        raise LonghaulError(f"task family {spec!r} lacks {', '.join(missing)}; a family defines FAMILY, VERSION, "
                            "make_split(split, n, difficulty, subfamilies) and score_many(tasks, replies) or WorkspaceTasks")
    if not callable(_attr(obj, "make_split")):
        raise LonghaulError(f"task family {spec!r}: make_split must be callable")
    score = _attr(obj, "score_many")
    kind = _attr(obj, "KIND", "answer" if score else "workspace")
    if kind not in ("answer", "workspace"):
        raise LonghaulError(f"task family {spec!r}: KIND must be 'answer' or 'workspace', got {kind!r}")
    if kind == "answer" and (score is None or _attr(obj, "reference_reply") is None):
        raise LonghaulError(f"task family {spec!r} is single-turn and needs score_many(tasks, replies) and reference_reply(task)")
    env = _attr(obj, "make_env")
    return Family(str(_attr(obj, "FAMILY")), str(_attr(obj, "VERSION")), kind, _attr(obj, "make_split"),
                  tuple(_attr(obj, "SUBFAMILIES", ()) or ()), tuple(_attr(obj, "DIFFICULTIES", (1,))),
                  tuple(_attr(obj, "SPLITS", ("train", "heldout"))), score, _attr(obj, "reference_reply"),
                  _attr(obj, "null_reply", lambda t: ""), tuple(_attr(obj, "STOP", ())), env,
                  _modules_of(obj, spec), demo_scripts=_attr(obj, "demo_scripts"), render_episode=_attr(obj, "render_episode"))


def _modules_of(obj, spec: str) -> tuple:
    """The module a spec names and the one that defines `obj` (a re-export may differ), the latter
    only when it is the plugin's own package or longhaul: an object of a standard-library or
    third-party type (a `SimpleNamespace`, a `functools.partial`) would otherwise tie the version
    to that library's files, which differ between machines."""
    named = spec.partition(":")[0]
    if inspect.ismodule(obj):
        defined = obj.__name__
    elif inspect.isclass(obj) or inspect.isfunction(obj):
        defined = obj.__module__
    else:
        defined = getattr(type(obj), "__module__", None)
    if defined and defined.split(".")[0] not in (named.split(".")[0], "longhaul"):
        defined = None
    return tuple(dict.fromkeys(m for m in (named, defined) if m))


def get_family(name: str) -> Family:
    if ":" in name:
        return family_from_object(load_object(name, "task family"), name)
    if name in _ANSWER:
        return _ANSWER[name]
    if name in _WORKSPACE:
        return _workspace_family(name)
    raise LonghaulError(f"unknown task family {name!r}; choose one of {', '.join([*_ANSWER, *_WORKSPACE])}, "
                        "or name your own as package.module:Name")


def reward_family(base: Family, spec: str) -> Family:
    """`base` scored by a user reward function `(completions, tasks) -> list[float]` (TRL's shape);
    a reply passes when its reward is >= 1."""
    fn = load_object(spec, "reward function")
    if not callable(fn):
        raise LonghaulError(f"reward function {spec!r} is not callable")
    if base.kind != "answer":
        raise LonghaulError(f"a reward function scores single-turn replies; family {base.name!r} is multi-turn (its env verifies)")

    def score_many(tasks, replies, **_):
        values = fn(list(replies), tasks=list(tasks))
        if len(values) != len(replies):
            raise LonghaulError(f"reward function {spec!r} returned {len(values)} rewards for {len(replies)} completions")
        return [Score(float(v), float(v) >= 1.0, "pass" if float(v) >= 1.0 else "fail") for v in values]

    return replace(base, score_many=score_many, modules=tuple(dict.fromkeys(base.modules + _modules_of(fn, spec))))
