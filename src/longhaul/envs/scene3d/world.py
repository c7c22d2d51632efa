"""The scene world: named entities with parents and typed components (an ECS), the single source
of truth of a `scene3d` episode.

Components are plain JSON values checked on the way in, so a snapshot is just the world as JSON
and `restore(snapshot(w))` gives an equal world. Every mistake in an edit raises a one-line
`LonghaulError` that names the fix; the env turns it into an observation for the agent.

This module knows nothing of Three.js (see `export`) or of browsers (see `verify`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from longhaul.envs.scene3d.assets import ASSETS, NAMES
from longhaul.errors import LonghaulError

FORMAT = 1  # bump when the snapshot layout changes
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")

# component -> field -> (kind, default); kinds: vec3, posvec3, vec3list, color, unit (0..1), pos (> 0), nonneg, num,
# bool, str:a|b|c, text (a line), code (a script), asset (a name in the asset library)
SCHEMAS: dict[str, dict[str, tuple]] = {
    "transform": {"position": ("vec3", [0.0, 0.0, 0.0]), "rotation": ("vec3", [0.0, 0.0, 0.0]),  # degrees, XYZ order
                  "scale": ("posvec3", [1.0, 1.0, 1.0])},
    "mesh": {"geometry": ("str:box|sphere|plane|cylinder", "box"), "size": ("posvec3", [1.0, 1.0, 1.0]),  # box w,h,d
             "radius": ("pos", 0.5), "height": ("pos", 1.0), "cast_shadow": ("bool", True), "receive_shadow": ("bool", True)},
    "material": {"color": ("color", "#cccccc"), "roughness": ("unit", 0.5), "metalness": ("unit", 0.0)},
    "light": {"type": ("str:ambient|directional|point", "directional"), "color": ("color", "#ffffff"),
              "intensity": ("nonneg", 1.0), "cast_shadow": ("bool", False), "distance": ("nonneg", 0.0)},  # point: 0 = no falloff
    "camera": {"fov": ("pos", 50.0), "near": ("pos", 0.1), "far": ("pos", 200.0), "look_at": ("vec3", [0.0, 0.0, 0.0])},
    # spin: turn about `axis` at `rate` deg/s; orbit: circle `center` at `radius` in the plane across `axis`, `rate` deg/s;
    # bob: move along `axis` by amplitude * sin(2 pi t / period) about the start
    "behaviour": {"type": ("str:spin|orbit|bob", "spin"), "axis": ("str:x|y|z", "y"), "rate": ("num", 0.0),
                  "center": ("vec3", [0.0, 0.0, 0.0]), "radius": ("pos", 1.0), "amplitude": ("nonneg", 0.5), "period": ("pos", 2.0)},
    "body": {"type": ("str:dynamic|static|kinematic", "dynamic"), "mass": ("pos", 1.0), "velocity": ("vec3", [0.0, 0.0, 0.0]),
             "gravity": ("bool", True)},
    # axis-aligned, centred on the entity; restitution and friction are its physics material
    "collider": {"shape": ("str:box|sphere", "box"), "size": ("posvec3", [1.0, 1.0, 1.0]), "radius": ("pos", 0.5),
                 "restitution": ("unit", 0.2), "friction": ("unit", 0.5)},
    "controls": {"type": ("str:keyboard", "keyboard"), "keys": ("str:arrows|wasd", "arrows"), "speed": ("pos", 3.0)},
    "script": {"source": ("code", "")},  # the body of function(self, dt, ctx), run every frame
    "hud": {"text": ("text", ""), "corner": ("str:top-left|top-right|bottom-left|bottom-right", "top-left"),
            "size": ("pos", 16.0), "color": ("color", "#ffffff")},  # "{score}" in text shows the score
    "pickup": {"points": ("num", 1.0)},  # a controlled entity touching it collects it: score += points
    "asset": {"name": ("asset", "crate")},  # a prefab from the asset library, drawn instead of a mesh
    "instances": {"positions": ("vec3list", [])},  # draw the entity's mesh or asset at each position (one draw call a part)
}
MAX_TEXT, MAX_CODE, MAX_INSTANCES = 200, 4000, 1000
# what each component does, for the agent's documentation search
COMPONENT_DOCS: dict[str, str] = {
    "transform": "Where the entity is: position [x, y, z] (y is up), rotation in degrees about x, y, z, scale; relative to its parent.",
    "mesh": "Draws a primitive: box (size w, h, d), sphere (radius), cylinder (radius, height) or plane (size w, h). "
            "Its centre is at the entity's position, so a box of height h rests on the ground at y = h / 2.",
    "material": "The surface of the entity's mesh or asset: color, roughness (0 mirror-like, 1 matte), metalness (0 or 1 usually).",
    "light": "ambient (everywhere), directional (sunlight from its position towards the origin) or point (from its position, "
             "fading to zero at distance unless 0); cast_shadow makes objects throw shadows onto others.",
    "camera": "The view: placed by the transform's position, aimed at look_at, with a vertical field of view fov in degrees.",
    "behaviour": "Built-in motion: spin turns about axis at rate degrees per second; orbit circles center at radius in the plane "
                 "across axis (about y: starts on the +x side, a positive rate turns counter-clockwise seen from above); "
                 "bob moves along axis by amplitude * sin(2 pi t / period) about where the entity starts.",
    "body": "A rigid body: dynamic bodies fall under gravity (if gravity) from their velocity and stop on the ground (y = 0) "
            "and on colliders; static and kinematic bodies are moved only by you (controls, scripts, behaviours).",
    "collider": "The entity's collision shape, axis-aligned and centred on it (box size or sphere radius); restitution is "
                "how much a bounce keeps (0 none, 1 all), friction slows sliding. An entity with a collider and no body is a wall.",
    "controls": "Lets the user move the entity on the ground plane with the arrow keys or W A S D at speed units per second "
                "(up/W is -z, away from the camera); with a collider, colliders stop it.",
    "script": "source is the body of function(self, dt, ctx), run 60 times a second: self is the Three.js object "
              "(self.position.x, self.rotation.y, self.material...), dt the step in seconds; ctx.time, ctx.score, "
              "ctx.key('ArrowLeft'), ctx.find('name'), ctx.addScore(n), ctx.THREE. An error stops the script and is reported.",
    "hud": "A line of text over the view in a corner (top-left, top-right, bottom-left, bottom-right), size in pixels; "
           "{score} in the text shows the current score, {time} the seconds since the start.",
    "pickup": "A collectible: when an entity with controls touches it, it disappears and the score grows by points.",
    "asset": "Draws a prefab from the asset library instead of a mesh (find names with search_assets); its origin is at its base.",
    "instances": "Draws the entity's mesh or asset once at every position of the list (relative to the entity), "
                 "as one draw call per part however many copies.",
}
COMPONENTS = tuple(SCHEMAS)


def _fix(kind: str, comp: str, key: str, value):
    """`value` checked against `kind`, as stored (floats, lists), or a LonghaulError naming the fix."""
    where = f"{comp}.{key}"
    num = (int, float)
    if kind in ("vec3", "posvec3"):
        if not (isinstance(value, (list, tuple)) and len(value) == 3 and all(isinstance(v, num) and not isinstance(v, bool) for v in value)):
            raise LonghaulError(f"{where} must be a list of 3 numbers like [0, 1, 0], got {value!r}")
        if kind == "posvec3" and min(value) <= 0:
            raise LonghaulError(f"{where} must have 3 numbers above 0, got {value!r}")
        return [float(v) for v in value]
    if kind == "vec3list":
        if not isinstance(value, (list, tuple)) or len(value) > MAX_INSTANCES:
            raise LonghaulError(f"{where} must be a list of at most {MAX_INSTANCES} positions like [[0, 0, 0], [2, 0, 0]], got {value!r:.80}")
        return [_fix("vec3", comp, f"{key}[{i}]", v) for i, v in enumerate(value)]
    if kind in ("text", "code"):
        limit = MAX_TEXT if kind == "text" else MAX_CODE
        if not isinstance(value, str) or len(value) > limit:
            raise LonghaulError(f"{where} must be a string of at most {limit} characters, got {value!r:.80}")
        if kind == "text" and "\n" in value:
            raise LonghaulError(f"{where} must be one line; use another hud entity for another line")
        return value
    if kind == "asset":
        if value not in ASSETS:
            raise LonghaulError(f"{where}: no asset named {value!r}; find one with search_assets (the library has {', '.join(NAMES)})")
        return value
    if kind == "color":
        if not (isinstance(value, str) and _COLOR.match(value)):
            raise LonghaulError(f"{where} must be a hex colour like \"#ff8800\", got {value!r}")
        return value.lower()
    if kind == "bool":
        if not isinstance(value, bool):
            raise LonghaulError(f"{where} must be true or false, got {value!r}")
        return value
    if kind.startswith("str:"):
        choices = kind[4:].split("|")
        if value not in choices:
            raise LonghaulError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
        return value
    if not isinstance(value, num) or isinstance(value, bool):
        raise LonghaulError(f"{where} must be a number, got {value!r}")
    value = float(value)
    if (kind == "unit" and not 0 <= value <= 1) or (kind == "pos" and value <= 0) or (kind == "nonneg" and value < 0):
        rule = {"unit": "between 0 and 1", "pos": "above 0", "nonneg": "0 or more"}[kind]
        raise LonghaulError(f"{where} must be {rule}, got {value!r}")
    return value


@dataclass
class Entity:
    name: str
    parent: str | None = None
    components: dict[str, dict] = field(default_factory=dict)


class World:
    """Entities by name, in creation order. Edits validate everything before changing anything."""

    def __init__(self, background: str = "#1e2430"):
        self.background = _fix("color", "world", "background", background)
        self.entities: dict[str, Entity] = {}

    # ---- entities --------------------------------------------------------------------
    def create_entity(self, name: str, parent: str | None = None) -> Entity:
        if not isinstance(name, str) or not _NAME.match(name):
            raise LonghaulError(f"entity name {name!r} is not valid; use a letter then letters, digits, _ or - (at most 40)")
        if name in self.entities:
            raise LonghaulError(f"entity {name!r} already exists; pick another name or set_component on it")
        if parent is not None:
            self.get(parent)
        ent = Entity(name, parent)
        self.entities[name] = ent
        return ent

    def remove_entity(self, name: str) -> list[str]:
        """Remove `name` and its descendants; returns the removed names."""
        self.get(name)
        gone = [name]
        for n, e in self.entities.items():  # creation order: a child comes after its parent
            if e.parent in gone:
                gone.append(n)
        for n in gone:
            del self.entities[n]
        return gone

    def get(self, name: str) -> Entity:
        if name not in self.entities:
            known = ", ".join(self.entities) or "none yet"
            raise LonghaulError(f"no entity named {name!r} (entities: {known}); create it with create_entity first")
        return self.entities[name]

    def set_parent(self, name: str, parent: str | None) -> None:
        ent = self.get(name)
        p = parent
        while p is not None:
            if p == name:
                raise LonghaulError(f"cannot parent {name!r} under {parent!r}: that would make a cycle")
            p = self.get(p).parent
        ent.parent = parent

    # ---- components ------------------------------------------------------------------
    def set_component(self, name: str, component: str, values: dict | None = None) -> dict:
        """Add or update `component` of `name` with `values` (unset fields keep their value or default)."""
        ent = self.get(name)
        if component not in SCHEMAS:
            raise LonghaulError(f"unknown component {component!r}; choose one of {', '.join(COMPONENTS)}")
        values = values or {}
        if not isinstance(values, dict):
            raise LonghaulError(f"values of {component} must be an object like {{\"field\": value}}, got {values!r}")
        schema = SCHEMAS[component]
        unknown = sorted(set(values) - set(schema))
        if unknown:
            raise LonghaulError(f"{component} has no field {unknown[0]!r}; its fields are {', '.join(schema)}")
        current = ent.components.get(component) or {k: copy.deepcopy(d) for k, (_, d) in schema.items()}
        new = dict(current)
        for key, value in values.items():
            new[key] = _fix(schema[key][0], component, key, value)
        ent.components[component] = new
        return new

    def remove_component(self, name: str, component: str) -> None:
        ent = self.get(name)
        if component not in ent.components:
            raise LonghaulError(f"entity {name!r} has no {component} component (it has {', '.join(ent.components) or 'none'})")
        del ent.components[component]

    def component(self, name: str, component: str) -> dict | None:
        return self.entities[name].components.get(component) if name in self.entities else None

    # ---- snapshot / restore ----------------------------------------------------------
    def snapshot(self) -> dict:
        """The whole world as JSON-ready data (what `export` writes as scene.json)."""
        return {"format": FORMAT, "background": self.background,
                "entities": [{"name": e.name, "parent": e.parent, "components": copy.deepcopy(e.components)}
                             for e in self.entities.values()]}

    @classmethod
    def restore(cls, data: dict) -> World:
        """A world from `snapshot()` data, validated as if built through the edits."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise LonghaulError(f"not a scene3d snapshot of format {FORMAT}; make one with World.snapshot()")
        world = cls(data.get("background", "#1e2430"))
        for e in data.get("entities", []):
            world.create_entity(e["name"], e.get("parent"))
            for comp, values in e.get("components", {}).items():
                world.set_component(e["name"], comp, values)
        return world

    def describe(self) -> str:
        """One line per entity, for the agent: name, parent and components."""
        if not self.entities:
            return "(the scene is empty)"
        out = []
        for e in self.entities.values():
            comps = "; ".join(f"{c} {v}" for c, v in e.components.items()) or "no components"
            out.append(f"{e.name}{f' (child of {e.parent})' if e.parent else ''}: {comps}")
        return "\n".join(out)
