"""The `scene3d` task family: build or change a 3D scene, asked for in plain words, through the
ECS tools (`longhaul.envs.scene3d.env`); the exported Three.js page is checked in a browser.

Tasks are pure functions of `(seed, difficulty, subfamily)` drawn with the task kit
(`longhaul.envs.kit`), train and held-out seeds as the other generated families. Sub-families:
- `composition`: place named primitives at given positions (all in frame);
- `lighting`: add a shadow-casting directional light to a dim scene;
- `materials`: give named objects a colour, roughness (and metalness);
- `animation`: make named objects spin about an axis at a rate.
Every task starts from a scene with a camera (and, but for `lighting`, lights) and carries its
checks and a reference solution (the oracle's tool calls). Difficulty adds objects and fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from longhaul.envs import kit
from longhaul.envs.kit import make_registry, pick, words
from longhaul.envs.scene3d.env import SceneEnv
from longhaul.envs.scene3d.world import World
from longhaul.envs.workspace import Action

FAMILY = "scene3d"
VERSION = "1"
DIFFICULTIES = kit.DIFFICULTIES
SUBFAMILIES, _register = make_registry()

_GEOMETRY = {"box": "BoxGeometry", "sphere": "SphereGeometry", "cylinder": "CylinderGeometry"}
_COLORS = {"red": "#d03a2c", "orange": "#e8892b", "yellow": "#e8d23a", "green": "#3aa856", "teal": "#2aa3a0",
           "blue": "#2f6fd6", "purple": "#8a4fd0", "pink": "#e06aa8", "white": "#f2f2f2", "brown": "#8a5a34"}


@dataclass(frozen=True)
class SceneTask:
    task_id: str  # "scene3d/v1/d{difficulty}/{seed}"
    family: str
    version: str
    seed: int
    difficulty: int
    subfamily: str
    instruction: str  # the user message
    start: str  # the starting world, as snapshot JSON
    checks: tuple  # verify's check dicts
    reference: tuple  # Actions that solve it (submit is added by the oracle)
    prompt: str = ""

    def __post_init__(self):
        if not self.prompt:
            object.__setattr__(self, "prompt", self.instruction)


# ------------------------------------------------------------------ scenes --

def _stage(lit: bool = True) -> World:
    """A camera looking at the origin over a ground plane; with `lit`, ambient and sun lights."""
    w = World()
    w.create_entity("camera")
    w.set_component("camera", "transform", {"position": [0, 5, 10]})
    w.set_component("camera", "camera", {"fov": 50, "look_at": [0, 0.5, 0]})
    w.create_entity("ground")
    w.set_component("ground", "transform", {"rotation": [-90, 0, 0]})
    w.set_component("ground", "mesh", {"geometry": "plane", "size": [14, 14, 1], "cast_shadow": False})
    w.set_component("ground", "material", {"color": "#5a6470", "roughness": 0.9})
    w.create_entity("ambient")
    w.set_component("ambient", "light", {"type": "ambient", "intensity": 0.6 if lit else 0.25})
    if lit:
        w.create_entity("key_light")
        w.set_component("key_light", "transform", {"position": [4, 8, 6]})
        w.set_component("key_light", "light", {"type": "directional", "intensity": 1.5})
    return w


def _slots(rng, n: int) -> list[list[float]]:
    """n ground positions far enough apart to be seen side by side from the camera."""
    xs = rng.sample([-3.5, -1.5, 0.5, 2.5], n)
    return [[x + rng.choice((0.0, 0.5)), 0.0, float(rng.choice((-1, 0, 1)))] for x in xs]


def _primitive(rng, geometry: str) -> tuple[dict, float]:
    """Mesh values for `geometry` and its half-height (to rest it on the ground)."""
    if geometry == "box":
        s = float(rng.choice((0.8, 1.0, 1.2)))
        return {"geometry": "box", "size": [s, s, s]}, s / 2
    if geometry == "sphere":
        r = float(rng.choice((0.5, 0.6, 0.7)))
        return {"geometry": "sphere", "radius": r}, r
    r, h = float(rng.choice((0.4, 0.5))), float(rng.choice((1.0, 1.4)))
    return {"geometry": "cylinder", "radius": r, "height": h}, h / 2


def _place(rng, w: World, names: list[str]) -> list[tuple[str, str, list[float], list[Action]]]:
    """Put primitives named `names` into `w`; returns (name, geometry, position, the Actions that make it)."""
    out = []
    for name, pos in zip(names, _slots(rng, len(names))):
        geometry = rng.choice(sorted(_GEOMETRY))
        mesh, half = _primitive(rng, geometry)
        pos[1] = half
        acts = [Action("create_entity", {"entity": name}), Action("set_component", {"entity": name, "component": "mesh", "values": mesh}),
                Action("set_component", {"entity": name, "component": "transform", "values": {"position": pos}})]
        for a in acts:
            getattr(w, a.tool)(**_world_args(a))
        out.append((name, geometry, pos, acts))
    return out


def _world_args(a: Action) -> dict:
    if a.tool == "create_entity":
        return {"name": a.args["entity"]}
    return {"name": a.args["entity"], "component": a.args["component"], "values": a.args["values"]}


def _vec(v) -> str:
    return "(" + ", ".join(f"{x:g}" for x in v) + ")"


def _visible(name: str) -> dict:
    return {"op": "visible", "name": name, "min_pixels": 20}


# ------------------------------------------------------------------ sub-families --

@_register("composition")
def _composition(rng, d):
    w = _stage()
    names = words(rng, pick(d, 1, 2, 3), 2, 2)
    placed = _place(rng, World(), names)  # the agent builds them: the start has none
    asks, checks, ref = [], [], []
    for name, geometry, pos, acts in placed:
        asks.append(f"a {geometry} named `{name}` resting on the ground at {_vec(pos)}")
        checks += [{"op": "value", "name": name, "path": "mesh.geometry", "expect": _GEOMETRY[geometry]},
                   {"op": "value", "name": name, "path": "position", "expect": pos, "tol": 0.05}, _visible(name)]
        ref += acts
    sizes = "; a box is 1 wide unless you choose, a sphere has radius 0.5" if d == 1 else ""
    text = f"Add {', '.join(asks[:-1]) + ' and ' if len(asks) > 1 else ''}{asks[-1]} to the scene{sizes}. Keep them in the camera's view."
    return w, text, checks + [{"op": "drawn"}], ref


@_register("lighting")
def _lighting(rng, d):
    w = _stage(lit=False)
    (name, _, _, _), = _place(rng, w, words(rng, 1, 2, 2))
    light = words(rng, 1, 2, 2, avoid=[name])[0] if d > 1 else "sun"
    pos = [float(rng.choice((-5, -3, 3, 5))), float(rng.choice((6, 8, 10))), float(rng.choice((3, 5)))]
    intensity = float(pick(d, 1.5, rng.choice((1.2, 1.8, 2.4)), rng.choice((1.2, 1.8, 2.4))))
    values = {"type": "directional", "intensity": intensity, "cast_shadow": True}
    if d == 3:
        values["color"] = rng.choice(("#fff2d6", "#ffe0b8", "#e8f0ff"))
    ref = [Action("create_entity", {"entity": light}),
           Action("set_component", {"entity": light, "component": "light", "values": values}),
           Action("set_component", {"entity": light, "component": "transform", "values": {"position": pos}})]
    checks = [{"op": "value", "name": light, "path": "light.type", "expect": "DirectionalLight"},
              {"op": "value", "name": light, "path": "light.cast_shadow", "expect": True},
              {"op": "value", "name": light, "path": "light.intensity", "expect": intensity, "tol": 0.05},
              {"op": "value", "name": light, "path": "position", "expect": pos, "tol": 0.1}]
    tint = ""
    if d == 3:
        checks.append({"op": "value", "name": light, "path": "light.color", "expect": values["color"], "tol": 3})
        tint = f", coloured {values['color']}"
    text = (f"The scene is lit only by a dim ambient light. Add a directional light named `{light}` at {_vec(pos)}, "
            f"intensity {intensity:g}{tint}, that casts shadows, so that `{name}` throws a shadow on the ground.")
    return w, text, checks + [_visible(name), {"op": "drawn"}], ref


@_register("materials")
def _materials(rng, d):
    w = _stage()
    placed = _place(rng, w, words(rng, pick(d, 1, 2, 2), 2, 2))
    targets = placed if d == 3 else placed[:1]
    colors = rng.sample(sorted(_COLORS), len(targets))
    asks, checks, ref = [], [], []
    for (name, _, _, _), cname in zip(targets, colors):
        values = {"color": _COLORS[cname], "roughness": float(rng.choice((0.1, 0.3, 0.6, 0.9)))}
        if d > 1:
            values["metalness"] = float(rng.choice((0.0, 0.5, 1.0)))
        metal = f" and metalness {values['metalness']:g}" if d > 1 else ""
        asks.append(f"`{name}` {cname} ({values['color']}) with roughness {values['roughness']:g}{metal}")
        ref.append(Action("set_component", {"entity": name, "component": "material", "values": values}))
        checks += [{"op": "value", "name": name, "path": f"material.{k}", "expect": v, "tol": 3 if k == "color" else 0.02}
                   for k, v in values.items()]
        checks.append(_visible(name))
    text = f"Change the material of {' and of '.join(asks)}. Leave everything else as it is."
    return w, text, checks, [Action("list_entities")] + ref


@_register("animation")
def _animation(rng, d):
    w = _stage()
    placed = _place(rng, w, words(rng, pick(d, 1, 2, 3), 2, 2))
    targets = placed[:pick(d, 1, 1, 2)]
    asks, checks, ref = [], [], []
    for name, _, _, _ in targets:
        axis = rng.choice("xyz") if d > 1 else "y"
        rate = float(rng.choice((15, 30, 45, 60, 90))) * (rng.choice((1, -1)) if d == 3 else 1)
        asks.append(f"`{name}` spin about the {axis} axis at {rate:g} degrees per second")
        ref.append(Action("set_component", {"entity": name, "component": "behaviour",
                                            "values": {"type": "spin", "axis": axis, "rate": rate}}))
        checks += [{"op": "spin", "name": name, "axis": axis, "rate": rate, "dt": 0.5, "tol": 0.5}, _visible(name)]
    text = f"Make {' and make '.join(asks)} (a negative rate turns the other way)." if d == 3 else f"Make {asks[0]}."
    return w, text, checks, [Action("list_entities")] + ref


# ------------------------------------------------------------------ public API --

def make_task(seed: int, difficulty: int = 1, subfamily: str | None = None) -> SceneTask:
    """The task for `seed` (its sub-family drawn from the seed unless given)."""
    kit.check_difficulty(difficulty)
    rng, sub = kit.draw(SUBFAMILIES, seed, subfamily)
    world, text, checks, ref = sub.build(rng, difficulty)
    return SceneTask(f"{FAMILY}/v{VERSION}/d{difficulty}/{seed}", FAMILY, VERSION, seed, difficulty, sub.name, text,
                     json.dumps(world.snapshot(), sort_keys=True), tuple(checks), tuple(ref))


def make_split(split: str, n: int, difficulty: int = 1, subfamilies: list[str] | None = None) -> list[SceneTask]:
    """`n` tasks with seeds `SPLIT_SEED_BASE[split] + i` (train: 0, heldout: 1_000_000)."""
    return kit.split_tasks(make_task, SUBFAMILIES, split, n, difficulty, subfamilies)


def make_env(task=None) -> SceneEnv:
    """A fresh env; every env shares the process's warm browser."""
    return SceneEnv()
