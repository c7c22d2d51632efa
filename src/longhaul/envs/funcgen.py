"""Procedurally generated "write a Python function" tasks (family ``funcgen``).

Each task is a pure function of ``(seed, difficulty)`` (and optionally a forced
sub-family): a private ``random.Random(seed)`` picks the sub-family, its
constants, the entry-point name and the hidden test inputs.  Expected test
values are computed by executing the reference solution at generation time.

A sub-family is a small builder ``(rng, difficulty) -> Spec`` registered with
``@_register(name, *entry_point_synonyms)`` in the task kit's registry (``longhaul.envs.kit``,
which also draws the sub-family and makes the splits); the registry and the builders are in
``funcgen_spec``, ``funcgen_basic`` and ``funcgen_structured``, this module makes the tasks.  Difficulty 1 is one plain
operation, 2 adds a condition or a second step, 3 composes two steps and adds
an edge case (empty input, negative numbers).
"""

from __future__ import annotations

import ast
import copy
import textwrap
from dataclasses import dataclass

# the builder modules register their sub-families on import, in this order (the order tasks draw them)
from longhaul.envs import funcgen_basic, funcgen_structured  # noqa: F401
from longhaul.envs import kit
from longhaul.envs.funcgen_spec import SUBFAMILIES

FAMILY = "funcgen"
VERSION = "1"
DIFFICULTIES = kit.DIFFICULTIES
SPLIT_SEED_BASE = kit.SPLIT_SEED_BASE
_MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    version: str
    subfamily: str
    seed: int
    difficulty: int
    entry_point: str
    prompt: str
    reference: str
    tests: str




# ----------------------------------------------------------------- assembly --

def _render(entry, impl, case, kind):
    """Return (setup lines, expression, expected value) for one test case."""
    if kind == "class":
        ops, query = case
        setup = [f"c = {entry}()"] + [f"c.{op}({', '.join(map(repr, args))})" for op, *args in ops]
        obj = impl()
        for op, *args in ops:
            getattr(obj, op)(*copy.deepcopy(args))
        return setup, f"c.{query}()", getattr(obj, query)()
    expr = f"{entry}({', '.join(map(repr, case))})"
    return [], expr, impl(*copy.deepcopy(case))


def _build(subfamily, seed, difficulty, entry, spec, allow_constant=False):
    """Assemble the Task, or return None when every expected value is the same
    (a constant-returning agent would pass) unless ``allow_constant``."""
    head = f"class {entry}:" if spec.kind == "class" else f"def {entry}({spec.params}):"
    reference = f"{head}\n{textwrap.indent(spec.body, '    ')}\n"
    namespace: dict = {}
    exec(reference, namespace)
    impl = namespace[entry]
    rendered = [_render(entry, impl, case, spec.kind) for case in spec.cases]
    if not 5 <= len(rendered) <= 8:
        raise RuntimeError(f"{subfamily}/d{difficulty}/{seed}: {len(rendered)} test cases")
    lines = []
    for setup, expr, value in rendered:
        if value is None or ast.literal_eval(repr(value)) != value:
            raise RuntimeError(f"{subfamily}: bad expected value {value!r} for {expr}")
        lines += setup + [f"assert {expr} == {value!r}"]
    if len({repr(value) for _, _, value in rendered}) == 1 and not allow_constant:
        return None
    setup, expr, value = rendered[0]
    if spec.kind == "class":
        first = f"Write a Python class `{entry}` {spec.description}."
        shown = f"For example, after `{'; '.join(setup)}`, `{expr}` should return `{value!r}`."
    else:
        first = f"Write a Python function `{entry}({spec.params})` that {spec.description}."
        shown = f"For example, `{expr}` should return `{value!r}`."
    prompt = f"{first}\n{shown}\nReply with only the code in one ```python block."
    return Task(task_id=f"{FAMILY}/v{VERSION}/{subfamily}/d{difficulty}/{seed}", family=FAMILY,
                version=VERSION, subfamily=subfamily, seed=seed, difficulty=difficulty, entry_point=entry,
                prompt=prompt, reference=reference, tests="\n".join(lines) + "\n")


def make_task(seed: int, difficulty: int = 1, subfamily: str | None = None) -> Task:
    """Build the task for ``seed``; the sub-family is drawn from the seed unless given."""
    kit.check_difficulty(difficulty)
    rng, family = kit.draw(SUBFAMILIES, seed, subfamily)
    for attempt in range(_MAX_ATTEMPTS):  # redraw (deterministically) if the tests are degenerate
        spec = family.build(rng, difficulty)
        entry = rng.choice(spec.names or family.names)
        task = _build(family.name, seed, difficulty, entry, spec, allow_constant=attempt == _MAX_ATTEMPTS - 1)
        if task is not None:
            return task


def make_split(split: str, n: int, difficulty: int = 1, subfamilies: list[str] | None = None) -> list[Task]:
    """``n`` tasks with seeds ``base, base+1, ...`` (train: 0, heldout: 1_000_000)."""
    return kit.split_tasks(make_task, SUBFAMILIES, split, n, difficulty, subfamilies)
