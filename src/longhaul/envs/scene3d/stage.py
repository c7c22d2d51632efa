"""What the scene3d sub-families share: their registry, the stage every task starts from, placing
named primitives, and the Actions and checks they are written in.

A builder `(rng, difficulty) -> (start World, instruction, checks, reference Actions)` registers
with `@register(name)`; `family` makes tasks of them. Owns no task of its own.
"""

from __future__ import annotations

from longhaul.envs.kit import make_registry
from longhaul.envs.scene3d.world import World
from longhaul.envs.workspace import Action

SUBFAMILIES, register = make_registry()

GEOMETRY = {"box": "BoxGeometry", "sphere": "SphereGeometry", "cylinder": "CylinderGeometry"}  # ours -> three's type
COLORS = {"red": "#d03a2c", "orange": "#e8892b", "yellow": "#e8d23a", "green": "#3aa856", "teal": "#2aa3a0",
          "blue": "#2f6fd6", "purple": "#8a4fd0", "pink": "#e06aa8", "white": "#f2f2f2", "brown": "#8a5a34"}


def stage(lit: bool = True) -> World:
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


def slots(rng, n: int) -> list[list[float]]:
    """n ground positions far enough apart to be seen side by side from the camera."""
    xs = rng.sample([-3.5, -1.5, 0.5, 2.5], n)
    return [[x + rng.choice((0.0, 0.5)), 0.0, float(rng.choice((-1, 0, 1)))] for x in xs]


def primitive(rng, geometry: str) -> tuple[dict, float]:
    """Mesh values for `geometry` and its half-height (to rest it on the ground)."""
    if geometry == "box":
        s = float(rng.choice((0.8, 1.0, 1.2)))
        return {"geometry": "box", "size": [s, s, s]}, s / 2
    if geometry == "sphere":
        r = float(rng.choice((0.5, 0.6, 0.7)))
        return {"geometry": "sphere", "radius": r}, r
    r, h = float(rng.choice((0.4, 0.5))), float(rng.choice((1.0, 1.4)))
    return {"geometry": "cylinder", "radius": r, "height": h}, h / 2


def entity(name: str, parent: str | None = None) -> Action:
    return Action("create_entity", {"entity": name, **({"parent": parent} if parent else {})})


def comp(name: str, component: str, values: dict) -> Action:
    return Action("set_component", {"entity": name, "component": component, "values": values})


def apply(w: World, actions: list[Action]) -> World:
    """Run world-editing Actions on `w` (how a builder makes its start scene from the same calls)."""
    for a in actions:
        if a.tool == "create_entity":
            w.create_entity(a.args["entity"], a.args.get("parent"))
        elif a.tool == "set_component":
            w.set_component(a.args["entity"], a.args["component"], a.args["values"])
        elif a.tool == "remove_entity":
            w.remove_entity(a.args["entity"])
    return w


def place(rng, w: World, names: list[str], geometries=None) -> list[tuple[str, str, list[float], list[Action]]]:
    """Put primitives named `names` into `w`; returns (name, geometry, position, the Actions that make it)."""
    out = []
    for name, pos in zip(names, slots(rng, len(names))):
        geometry = rng.choice(sorted(geometries or GEOMETRY))
        mesh, half = primitive(rng, geometry)
        pos[1] = half
        acts = [entity(name), comp(name, "mesh", mesh), comp(name, "transform", {"position": pos})]
        apply(w, acts)
        out.append((name, geometry, pos, acts))
    return out


def vec(v) -> str:
    return "(" + ", ".join(f"{x:g}" for x in v) + ")"


def visible(name: str, min_pixels: int = 20) -> dict:
    return {"op": "visible", "name": name, "min_pixels": min_pixels}


def value(name: str, path: str, expect, tol: float | None = None) -> dict:
    return {"op": "value", "name": name, "path": path, "expect": expect, **({"tol": tol} if tol is not None else {})}
