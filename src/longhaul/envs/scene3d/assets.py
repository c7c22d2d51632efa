"""The scene3d asset library: prefabs built from primitives, shipped with the package, found by
`search` (the agent's `search_assets` tool) and drawn by the runtime from `assets.json`.

An asset is a list of parts, each a primitive (the mesh component's geometries) with its offset
from the entity's origin and a colour; an entity shows one through its `asset` component, once or
at every position of its `instances` component. The origin is at the asset's base, so an asset at
y = 0 stands on the ground. Owns the catalogue and its search; the drawing lives in runtime.js.
"""

from __future__ import annotations

import re


def _p(geometry: str, offset, color: str, size=None, radius: float = 0.5, height: float = 1.0) -> dict:
    return {"geometry": geometry, "offset": [float(v) for v in offset], "color": color,
            "size": [float(v) for v in (size or (1, 1, 1))], "radius": float(radius), "height": float(height)}


# name -> (description, tags, parts)
ASSETS: dict[str, tuple[str, tuple[str, ...], list[dict]]] = {
    "tree": ("a round leafy tree: brown trunk, green crown", ("tree", "plant", "forest", "park", "nature", "oak"),
             [_p("cylinder", (0, 0.6, 0), "#7a5230", radius=0.15, height=1.2), _p("sphere", (0, 1.6, 0), "#3f9a45", radius=0.7)]),
    "pine": ("a pine tree: trunk and a tall dark-green cone of boxes", ("tree", "pine", "conifer", "fir", "forest", "christmas"),
             [_p("cylinder", (0, 0.4, 0), "#6b4526", radius=0.12, height=0.8), _p("box", (0, 1.2, 0), "#2e6b3a", size=(1.0, 0.8, 1.0)),
              _p("box", (0, 1.9, 0), "#2e6b3a", size=(0.6, 0.7, 0.6))]),
    "bush": ("a low round bush", ("bush", "shrub", "plant", "hedge", "garden"), [_p("sphere", (0, 0.35, 0), "#4c8c3c", radius=0.4)]),
    "rock": ("a grey boulder", ("rock", "stone", "boulder", "nature"), [_p("sphere", (0, 0.3, 0), "#7d7d7d", radius=0.45)]),
    "crate": ("a wooden crate", ("crate", "box", "wooden", "cargo", "container"), [_p("box", (0, 0.4, 0), "#a8743a", size=(0.8, 0.8, 0.8))]),
    "barrel": ("an upright barrel", ("barrel", "cask", "drum", "container"), [_p("cylinder", (0, 0.5, 0), "#8a5a2b", radius=0.35, height=1.0)]),
    "lamp_post": ("a street lamp: a thin pole with a glowing head", ("lamp", "street", "light", "lamppost", "pole", "streetlight"),
                  [_p("cylinder", (0, 1.25, 0), "#333333", radius=0.06, height=2.5), _p("sphere", (0, 2.6, 0), "#fff3b0", radius=0.18)]),
    "fence": ("a fence segment 2 wide: two posts and two rails", ("fence", "barrier", "rail", "garden", "farm"),
              [_p("box", (-0.9, 0.5, 0), "#b08a5a", size=(0.12, 1.0, 0.12)), _p("box", (0.9, 0.5, 0), "#b08a5a", size=(0.12, 1.0, 0.12)),
               _p("box", (0, 0.7, 0), "#b08a5a", size=(1.9, 0.1, 0.06)), _p("box", (0, 0.35, 0), "#b08a5a", size=(1.9, 0.1, 0.06))]),
    "house": ("a small house: walls and a darker roof block", ("house", "home", "building", "cottage", "hut"),
              [_p("box", (0, 0.75, 0), "#e0d2b4", size=(2.0, 1.5, 1.6)), _p("box", (0, 1.75, 0), "#9c3b2e", size=(2.2, 0.5, 1.8)),
               _p("box", (0, 0.5, 0.81), "#5a3a22", size=(0.4, 1.0, 0.02))]),
    "tower": ("a stone tower: a tall cylinder with a cap", ("tower", "castle", "turret", "keep", "building"),
              [_p("cylinder", (0, 1.5, 0), "#9a9a8c", radius=0.6, height=3.0), _p("cylinder", (0, 3.2, 0), "#6d6d62", radius=0.75, height=0.4)]),
    "table": ("a table: top and four legs", ("table", "desk", "furniture"),
              [_p("box", (0, 0.75, 0), "#8b6a45", size=(1.2, 0.08, 0.8))] +
              [_p("box", (x, 0.36, z), "#6e5236", size=(0.08, 0.72, 0.08)) for x in (-0.5, 0.5) for z in (-0.3, 0.3)]),
    "chair": ("a chair: seat, back and legs", ("chair", "seat", "furniture"),
              [_p("box", (0, 0.45, 0), "#8b6a45", size=(0.5, 0.06, 0.5)), _p("box", (0, 0.75, -0.22), "#8b6a45", size=(0.5, 0.6, 0.06))] +
              [_p("box", (x, 0.21, z), "#6e5236", size=(0.05, 0.42, 0.05)) for x in (-0.2, 0.2) for z in (-0.2, 0.2)]),
    "bench": ("a park bench", ("bench", "seat", "park", "furniture"),
              [_p("box", (0, 0.45, 0), "#9b7040", size=(1.6, 0.08, 0.45)), _p("box", (0, 0.8, -0.2), "#9b7040", size=(1.6, 0.4, 0.06)),
               _p("box", (-0.7, 0.22, 0), "#3a3a3a", size=(0.08, 0.44, 0.4)), _p("box", (0.7, 0.22, 0), "#3a3a3a", size=(0.08, 0.44, 0.4))]),
    "car": ("a toy car: body, cabin and four wheels", ("car", "vehicle", "auto", "automobile", "toy"),
            [_p("box", (0, 0.45, 0), "#c8322a", size=(1.8, 0.5, 0.9)), _p("box", (-0.1, 0.85, 0), "#dddddd", size=(0.9, 0.4, 0.8))] +
            [_p("cylinder", (x, 0.2, z), "#222222", radius=0.2, height=0.15) for x in (-0.6, 0.6) for z in (-0.45, 0.45)]),
    "snowman": ("a snowman of three stacked spheres", ("snowman", "snow", "winter", "christmas"),
                [_p("sphere", (0, 0.5, 0), "#f5f5f5", radius=0.5), _p("sphere", (0, 1.2, 0), "#f5f5f5", radius=0.35),
                 _p("sphere", (0, 1.7, 0), "#f5f5f5", radius=0.25)]),
    "rocket": ("a small rocket on its fins", ("rocket", "spaceship", "missile", "space"),
               [_p("cylinder", (0, 1.0, 0), "#e8e8e8", radius=0.3, height=1.6), _p("sphere", (0, 1.85, 0), "#d03a2c", radius=0.3),
                _p("box", (0, 0.25, 0), "#d03a2c", size=(1.0, 0.5, 0.08))]),
    "arch": ("a stone arch: two pillars and a lintel", ("arch", "gate", "portal", "doorway"),
             [_p("box", (-0.8, 1.0, 0), "#a39e93", size=(0.4, 2.0, 0.4)), _p("box", (0.8, 1.0, 0), "#a39e93", size=(0.4, 2.0, 0.4)),
              _p("box", (0, 2.15, 0), "#a39e93", size=(2.0, 0.3, 0.4))]),
    "well": ("a water well: round wall and a roof on posts", ("well", "water", "village"),
             [_p("cylinder", (0, 0.35, 0), "#8f8f86", radius=0.6, height=0.7), _p("box", (-0.5, 1.0, 0), "#6e5236", size=(0.08, 1.3, 0.08)),
              _p("box", (0.5, 1.0, 0), "#6e5236", size=(0.08, 1.3, 0.08)), _p("box", (0, 1.7, 0), "#9c3b2e", size=(1.4, 0.1, 1.0))]),
    "signpost": ("a signpost with a board", ("sign", "signpost", "board", "marker"),
                 [_p("box", (0, 0.7, 0), "#6e5236", size=(0.08, 1.4, 0.08)), _p("box", (0, 1.25, 0.05), "#c9a66b", size=(0.8, 0.4, 0.04))]),
    "mushroom": ("a big mushroom: stem and red cap", ("mushroom", "fungus", "toadstool", "forest"),
                 [_p("cylinder", (0, 0.3, 0), "#f0e6d2", radius=0.12, height=0.6), _p("sphere", (0, 0.65, 0), "#c0302a", radius=0.35)]),
    "coin": ("a gold coin floating flat (a collectible)", ("coin", "gold", "collectible", "pickup", "money", "token"),
             [_p("cylinder", (0, 0.35, 0), "#f2c230", radius=0.3, height=0.08)]),
}
NAMES = tuple(sorted(ASSETS))


def catalogue() -> dict:
    """The library as the runtime reads it (assets.json): name -> list of parts."""
    return {name: parts for name, (_, _, parts) in sorted(ASSETS.items())}


def _words(text: str) -> set[str]:
    return {w.rstrip("s") for w in re.findall(r"[a-z]+", text.lower())}


def search(query: str, k: int = 5) -> str:
    """The assets that best match `query` (words in their name, tags or description), one a line."""
    words = _words(query or "")
    if not words:
        return f"search_assets needs words to look for (e.g. \"tree\", \"street lamp\"); the library has: {', '.join(NAMES)}"
    scored = []
    for name, (desc, tags, parts) in ASSETS.items():
        s = 3 * len(words & _words(name.replace("_", " "))) + 2 * len(words & _words(" ".join(tags))) + len(words & _words(desc))
        if s:
            scored.append((-s, name))
    if not scored:
        return f"no asset matches {query!r}; the library has: {', '.join(NAMES)}"
    lines = []
    for _, name in sorted(scored)[:k]:
        desc, tags, parts = ASSETS[name]
        top = max(p["offset"][1] + (p["size"][1] / 2 if p["geometry"] in ("box", "plane") else p["radius"] if p["geometry"] == "sphere"
                                    else p["height"] / 2) for p in parts)
        lines.append(f"{name}: {desc} ({len(parts)} parts, {top:.2g} tall; tags: {', '.join(tags)})")
    return "\n".join(lines)
