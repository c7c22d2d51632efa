"""scene3d's demonstration scripts: the replies of a verified episode for each variant that
`longhaul.agent.demos` replays (reference, explore, repair), written in this family's tools.

- `reference`: the task's reference calls, then submit;
- `explore`: look first (list the scene, read the documentation of the component the task is
  about) in a seeded order, act, list the scene again, submit;
- `repair`: a plausible wrong call, the error the env answers with, a short note and the fix:
  * `bad_value`: a field given in the wrong form (a colour by name, a position of two numbers, a
    number out of its range, an unknown field), then the right call;
  * `unknown_entity`: a call naming an entity of the start scene with a typo, then a look at the
    scene and the right call.
Owns the scripts only; `agent.demos` runs them and keeps the episodes that pass.
"""

from __future__ import annotations

import json
import random

from longhaul.envs.tools import format_call
from longhaul.envs.workspace import Action

NOTES = {
    "bad_value": ("That value has the wrong form. I will set it again as the error says.",
                  "The call was refused: the field needs another format. Fixing it."),
    "unknown_entity": ("There is no entity by that name. Let me list the scene to get the name right.",
                       "Wrong name: I will check the entities first."),
}
_COLOR_NAMES = ("red", "blue", "green", "white", "orange")


def _sets(task) -> list[tuple[int, Action]]:
    return [(k, a) for k, a in enumerate(task.reference) if a.tool == "set_component"]


def _wrong_value(a: Action, rng: random.Random) -> Action | None:
    """`a` with one of its values in a form the world refuses, or None."""
    values = dict(a.args["values"])
    for key, v in values.items():
        if isinstance(v, str) and v.startswith("#"):
            values[key] = rng.choice(_COLOR_NAMES)
        elif isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v):
            values[key] = v[:2]
        elif key in ("roughness", "metalness", "restitution", "friction") and isinstance(v, (int, float)):
            values[key] = round(float(v) + 1.5, 2)
        else:
            continue
        return Action(a.tool, {**a.args, "values": values})
    if values:
        key = next(iter(values))
        return Action(a.tool, {**a.args, "values": {**values, key + "s": values[key]}})  # an unknown field
    return None


def _bad_value(task, rng: random.Random) -> tuple[list[str], int] | None:
    ref = [a.text() for a in task.reference]
    for k, a in _sets(task):
        wrong = _wrong_value(a, rng)
        if wrong is not None:
            return ref[:k] + [wrong.text(), f"{rng.choice(NOTES['bad_value'])}\n{ref[k]}"] + ref[k + 1:], k
    return None


def _typo(name: str, rng: random.Random) -> str:
    k = rng.randrange(1, len(name)) if len(name) > 2 else 1
    return name[:k] + name[k:k + 1] * 2 + name[k + 1:]  # a doubled letter


def _unknown_entity(task, rng: random.Random) -> tuple[list[str], int] | None:
    start = {e["name"] for e in json.loads(task.start)["entities"]}
    ref = [a.text() for a in task.reference]
    for k, a in _sets(task):
        name = a.args["entity"]
        if name in start and _typo(name, rng) not in start:
            wrong = Action(a.tool, {**a.args, "entity": _typo(name, rng)})
            fix = [f"{rng.choice(NOTES['unknown_entity'])}\n{format_call('list_entities')}", ref[k]]
            return ref[:k] + [wrong.text()] + fix + ref[k + 1:], k
    return None


STRATEGIES = {"bad_value": _bad_value, "unknown_entity": _unknown_entity}


def demo_scripts(task, variant: str, rng: random.Random) -> tuple[list[str], int | None, str | None] | None:
    """The replies of one demonstration (submit last), the index of the reply that must fail
    (repairs; else None) and the strategy; None where the variant does not apply."""
    ref = [a.text() for a in task.reference]
    submit = format_call("submit")
    if variant == "reference":
        return ref + [submit], None, None
    if variant == "explore":
        looks = [format_call("list_entities")]
        topics = [a.args["component"] for _, a in _sets(task)]
        if topics:
            looks.append(format_call("search_docs", query=f"{topics[0]} component"))
        rng.shuffle(looks)
        return looks + [r for r in ref if r not in looks] + [format_call("list_entities"), submit], None, None
    names = list(STRATEGIES)
    rng.shuffle(names)
    for name in names:
        got = STRATEGIES[name](task, rng)
        if got is not None:
            return got[0] + [submit], got[1], name
    return None
