"""scene3d sub-families about how a scene looks: `composition` (place named primitives), `lighting`
(a shadow-casting light), `materials` (colour, roughness, metalness), `camera` (aim it at the
scene), `assets` (find a prefab by its description and place it) and `instancing` (many copies of a
prefab in one draw call a part). Each builder returns (start world, instruction, checks, reference).
"""

from __future__ import annotations

from longhaul.envs.kit import pick, words
from longhaul.envs.scene3d.assets import ASSETS
from longhaul.envs.scene3d.stage import (
    COLORS,
    GEOMETRY,
    apply,
    comp,
    entity,
    place,
    register,
    stage,
    value,
    vec,
    visible,
)
from longhaul.envs.scene3d.world import World
from longhaul.envs.workspace import Action


@register("composition")
def composition(rng, d):
    w = stage()
    names = words(rng, pick(d, 1, 2, 3), 2, 2)
    placed = place(rng, World(), names)  # the agent builds them: the start has none
    asks, checks, ref = [], [], []
    for name, geometry, pos, acts in placed:
        asks.append(f"a {geometry} named `{name}` resting on the ground at {vec(pos)}")
        checks += [value(name, "mesh.geometry", GEOMETRY[geometry]), value(name, "position", pos, 0.05), visible(name)]
        ref += acts
    sizes = "; a box is 1 wide unless you choose, a sphere has radius 0.5" if d == 1 else ""
    text = f"Add {', '.join(asks[:-1]) + ' and ' if len(asks) > 1 else ''}{asks[-1]} to the scene{sizes}. Keep them in the camera's view."
    return w, text, checks + [{"op": "drawn"}], ref


@register("lighting")
def lighting(rng, d):
    w = stage(lit=False)
    (name, _, _, _), = place(rng, w, words(rng, 1, 2, 2))
    light = words(rng, 1, 2, 2, avoid=[name])[0] if d > 1 else "sun"
    pos = [float(rng.choice((-6, -4, 4, 6))), float(rng.choice((5, 6, 8))), float(rng.choice((0, 1, 2)))]  # from the side: shadows in view
    intensity = float(pick(d, 1.5, rng.choice((1.2, 1.8, 2.4)), rng.choice((1.2, 1.8, 2.4))))
    values = {"type": "directional", "intensity": intensity, "cast_shadow": True}
    if d == 3:
        values["color"] = rng.choice(("#fff2d6", "#ffe0b8", "#e8f0ff"))
    ref = [entity(light), comp(light, "light", values), comp(light, "transform", {"position": pos})]
    checks = [value(light, "light.type", "DirectionalLight"), value(light, "light.cast_shadow", True),
              value(light, "light.intensity", intensity, 0.05), value(light, "position", pos, 0.1)]
    tint = ""
    if d == 3:
        checks.append(value(light, "light.color", values["color"], 3))
        tint = f", coloured {values['color']}"
    text = (f"The scene is lit only by a dim ambient light. Add a directional light named `{light}` at {vec(pos)}, "
            f"intensity {intensity:g}{tint}, that casts shadows, so that `{name}` throws a shadow on the ground.")
    return w, text, checks + [{"op": "shadow", "name": light, "min_pixels": 40}, visible(name), {"op": "drawn"}], ref


@register("materials")
def materials(rng, d):
    w = stage()
    placed = place(rng, w, words(rng, pick(d, 1, 2, 2), 2, 2))
    targets = placed if d == 3 else placed[:1]
    colors = rng.sample(sorted(COLORS), len(targets))
    asks, checks, ref = [], [], []
    for (name, _, _, _), cname in zip(targets, colors):
        values = {"color": COLORS[cname], "roughness": float(rng.choice((0.1, 0.3, 0.6, 0.9)))}
        if d > 1:
            values["metalness"] = float(rng.choice((0.0, 0.5, 1.0)))
        metal = f" and metalness {values['metalness']:g}" if d > 1 else ""
        asks.append(f"`{name}` {cname} ({values['color']}) with roughness {values['roughness']:g}{metal}")
        ref.append(comp(name, "material", values))
        checks += [value(name, f"material.{k}", v, 3 if k == "color" else 0.02) for k, v in values.items()]
        checks.append(visible(name))
    text = f"Change the material of {' and of '.join(asks)}. Leave everything else as it is."
    return w, text, checks, [Action("list_entities")] + ref


@register("camera")
def camera(rng, d):
    w = stage()
    placed = place(rng, w, words(rng, pick(d, 2, 2, 3), 2, 2))
    away = [float(rng.choice((-6, 6))), float(rng.choice((4, 6))), 30.0]
    w.set_component("camera", "camera", {"look_at": away})  # it looks away from the scene: nothing is in view
    xs, zs = [p[0] for _, _, p, _ in placed], [p[2] for _, _, p, _ in placed]
    target = [round((min(xs) + max(xs)) / 2, 2), 0.5, round((min(zs) + max(zs)) / 2, 2)]
    values = {"look_at": target}
    checks = [visible(n) for n, _, _, _ in placed]
    names = " and ".join(f"`{n}`" for n, _, _, _ in placed)
    text = f"The camera `camera` looks away from the scene. Aim it (its camera.look_at) so that {names} are all in view."
    ref = [Action("list_entities")]
    if d > 1:
        pos = [float(rng.choice((-2, 0, 2))), float(rng.choice((4, 5, 6))), float(rng.choice((9, 10, 11)))]
        ref.append(comp("camera", "transform", {"position": pos}))
        checks.append(value("camera", "position", pos, 0.05))
        text += f" Put the camera at {vec(pos)}."
    if d == 3:
        values["fov"] = float(rng.choice((55, 60, 65)))
        checks.append(value("camera", "camera.fov", values["fov"], 0.01))
        text += f" Give it a field of view of {values['fov']:g} degrees."
    ref.append(comp("camera", "camera", values))
    return w, text, checks, ref


def _phrase(asset: str) -> str:
    """How a task names an asset: its description up to the colon (never its id)."""
    return ASSETS[asset][0].split(":")[0].split(" (")[0]


@register("assets")
def assets(rng, d):
    w = stage()
    chosen = rng.sample(sorted(ASSETS), pick(d, 1, 1, 2))
    names = words(rng, len(chosen), 2, 2)
    spots = [[x + rng.choice((0.0, 0.5)), 0.0, float(rng.choice((-1, 0, 1)))] for x in rng.sample([-3.0, -0.5, 2.0], len(chosen))]
    asks, checks, ref = [], [], []
    for asset, name, pos in zip(chosen, names, spots):
        if d > 1:
            pos[0] += 0.5
        asks.append(f"{_phrase(asset)} named `{name}` standing on the ground at {vec(pos)}")
        ref += [Action("search_assets", {"query": _phrase(asset)}), entity(name), comp(name, "asset", {"name": asset}),
                comp(name, "transform", {"position": pos})]
        checks += [value(name, "asset", asset), value(name, "position", pos, 0.05), visible(name)]
    text = (f"Add {' and '.join(asks)}. Use the asset library (search_assets) for "
            f"{'it' if len(asks) == 1 else 'them'} rather than building from primitives.")
    return w, text, checks + [{"op": "drawn"}], ref


@register("instancing")
def instancing(rng, d):
    w = stage()
    asset = rng.choice(("tree", "pine", "bush", "rock", "crate", "barrel", "lamp_post", "mushroom", "fence"))
    name = words(rng, 1, 2, 2)[0]
    z = float(rng.choice((-2, -1, 0)))
    if d < 3:
        n = pick(d, 5, rng.choice((8, 10, 12)), 0)
        x0, step = -float(n - 1) / 2 * 1.2, 1.2
        positions = [[round(x0 + i * step, 2), 0.0, z] for i in range(n)]
        layout = f"{n} of them in a row along x from {positions[0][0]:g} to {positions[-1][0]:g} (1.2 apart) at z = {z:g}"
    else:
        cols, rows = rng.choice((4, 5)), rng.choice((3, 4))
        positions = [[round(-3 + c * 1.5, 2), 0.0, round(z - r * 1.5, 2)] for r in range(rows) for c in range(cols)]
        layout = f"a grid of {cols} x {rows} of them: x = -3, -1.5, ... ({cols} columns), z = {z:g}, {z - 1.5:g}, ... ({rows} rows)"
    parts = len(ASSETS[asset][2])
    what = f"the `{asset}` asset" if d == 1 else f"{_phrase(asset)} from the asset library"
    text = (f"Plant {layout}, using {what}, all as one entity named `{name}` with an instances component "
            f"(so that every part of the prefab is one draw call however many copies there are).")
    ref = ([Action("search_assets", {"query": _phrase(asset)})] if d > 1 else []) + [
        entity(name), comp(name, "asset", {"name": asset}), comp(name, "instances", {"positions": positions})]
    apply(World(), ref[-3:])  # the reference is valid
    checks = [value(name, "asset", asset), value(name, "instances", len(positions)), visible(name, 60),
              {"op": "budget", "max_calls": 3 + parts, "max_frame_ms": 1000}]
    return w, text, checks, ref
