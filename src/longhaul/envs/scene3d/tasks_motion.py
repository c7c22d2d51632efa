"""scene3d sub-families about how a scene behaves, checked with the verifier's clock and real key
events: `animation` (spin, bob, orbit), `physics` (dynamic bodies that fall and rest on colliders),
`controls` (a player moved by keys, stopped by a wall), `hud` (text and a score that counts
pickups), `scripting` (per-frame scripts the agent writes) and `repair` (a broken scene or script
to fix). Expected positions follow the runtime's rules (sim.js): fixed steps of 1/60 s, orbits
from angle 0 on the first axis of their plane, bobs about the start.
"""

from __future__ import annotations

import math

from longhaul.envs.kit import pick, words
from longhaul.envs.scene3d.stage import (
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
from longhaul.envs.workspace import Action

_AXES = "xyz"
_PLANE = {"x": ("y", "z", 1), "y": ("x", "z", -1), "z": ("x", "y", 1)}  # as sim.js: the circle's axes, the second's sign


def _orbit_at(center, radius, axis, rate, t, start) -> list[float]:
    u, v, sign = _PLANE[axis]
    a = math.radians(rate * t)
    pos = list(start)
    pos[_AXES.index(u)] = center[_AXES.index(u)] + radius * math.cos(a)
    pos[_AXES.index(v)] = center[_AXES.index(v)] + sign * radius * math.sin(a)
    return [round(p, 4) for p in pos]


def _after(name: str, path: str, dt: float, expect=None, tol: float = 0.05, **bounds) -> dict:
    c = {"op": "after", "dt": dt, "name": name, "path": path, **bounds}
    if expect is not None:
        c.update(expect=expect, tol=tol)
    return c


@register("animation")
def animation(rng, d):
    w = stage()
    placed = place(rng, w, words(rng, pick(d, 1, 2, 3), 2, 2))
    asks, checks, ref = [], [], [Action("list_entities")]
    name, _, pos, _ = placed[0]
    kind = pick(d, "spin", rng.choice(("spin", "bob")), "orbit")
    if kind == "spin":
        axis = rng.choice("xyz") if d > 1 else "y"
        rate = float(rng.choice((15, 30, 45, 60, 90)))
        asks.append(f"`{name}` spin about the {axis} axis at {rate:g} degrees per second")
        ref.append(comp(name, "behaviour", {"type": "spin", "axis": axis, "rate": rate}))
        checks.append({"op": "spin", "name": name, "axis": axis, "rate": rate, "dt": 0.5, "tol": 0.5})
    elif kind == "bob":
        amp, period = float(rng.choice((0.3, 0.5, 0.8))), float(rng.choice((1, 2, 4)))
        asks.append(f"`{name}` bob up and down (along y) by {amp:g} about where it is, once every {period:g} seconds")
        ref.append(comp(name, "behaviour", {"type": "bob", "axis": "y", "amplitude": amp, "period": period}))
        top = [pos[0], round(pos[1] + amp, 4), pos[2]]
        checks.append(_after(name, "position", period / 4, top, 0.02))  # a quarter period: the top
    else:
        radius, rate = float(rng.choice((1.0, 1.5, 2.0))), float(rng.choice((30, 45, 90))) * rng.choice((1, -1))
        center = [round(pos[0], 2), pos[1], pos[2]]
        asks.append(f"`{name}` orbit the point {vec(center)} in the horizontal plane (about the y axis) at radius {radius:g}, "
                    f"{rate:g} degrees per second (a positive rate turns counter-clockwise seen from above; start on the +x side)")
        ref.append(comp(name, "behaviour", {"type": "orbit", "axis": "y", "center": center, "radius": radius, "rate": rate}))
        checks += [_after(name, "position", 1.0, _orbit_at(center, radius, "y", rate, 1.0, pos), 0.02),
                   _after(name, "position", 1.0, _orbit_at(center, radius, "y", rate, 2.0, pos), 0.02)]
    if d == 3:
        other, _, _, _ = placed[1]
        rate2 = float(rng.choice((20, 40))) * rng.choice((1, -1))
        asks.append(f"`{other}` spin about the x axis at {rate2:g} degrees per second (a negative rate turns the other way)")
        ref.append(comp(other, "behaviour", {"type": "spin", "axis": "x", "rate": rate2}))
        checks.append({"op": "spin", "name": other, "axis": "x", "rate": rate2, "dt": 0.5, "tol": 0.5})
    return w, f"Make {' and make '.join(asks)}.", checks + [visible(name)], ref


@register("physics")
def physics(rng, d):
    w = stage()
    ball = words(rng, 1, 2, 2)[0]
    r = float(rng.choice((0.3, 0.4, 0.5)))
    x, z = float(rng.choice((-2, -1, 0, 1, 2))), float(rng.choice((-1, 0, 1)))
    h = float(rng.choice((3, 4, 5)))
    e = float(rng.choice((0.2, 0.3, 0.5)))
    apply(w, [entity(ball), comp(ball, "mesh", {"geometry": "sphere", "radius": r}), comp(ball, "transform", {"position": [x, h, z]})])
    ref = [comp(ball, "body", {"type": "dynamic"}), comp(ball, "collider", {"shape": "sphere", "radius": r, "restitution": e})]
    rest = r
    text = (f"`{ball}` (a sphere of radius {r:g}) hangs at height {h:g}. Make it a dynamic rigid body with a sphere collider "
            f"of radius {r:g} and restitution {e:g}, so that it falls, bounces and comes to rest")
    if d == 2:
        plat = words(rng, 1, 2, 2, avoid=[ball])[0]
        ph = float(rng.choice((0.5, 1.0)))
        size = [2.0, ph, 2.0]
        apply(w, [entity(plat), comp(plat, "mesh", {"geometry": "box", "size": size}), comp(plat, "transform", {"position": [x, ph / 2, z]})])
        ref.append(comp(plat, "collider", {"shape": "box", "size": size}))
        rest = ph + r
        text += f" on top of `{plat}` (a {size[0]:g} x {ph:g} x {size[2]:g} box: give it a matching box collider so it stops the ball)"
    else:
        text += " on the ground"
    checks = [value(ball, "body.type", "dynamic"), value(ball, "collider.restitution", e, 0.01),
              _after(ball, "position", 4.0, [x, rest, z], 0.03)]
    if d == 3:  # thrown: it lands further along and friction stops its slide
        slide, z0 = float(rng.choice((1.0, 1.5))), z - 1.5
        ref[0] = comp(ball, "body", {"type": "dynamic", "velocity": [0.0, 0.0, slide]})
        ref.insert(1, comp(ball, "transform", {"position": [x, h, z0]}))
        text += (f", thrown from {vec([x, h, z0])} with a velocity of {slide:g} along +z, which friction (collider.friction, "
                 f"0.5 by default) stops once it rolls on the ground")
        checks[-1] = _after(ball, "position.1", 4.0, rest, 0.03)
        checks += [{"op": "value", "name": ball, "path": "position.2", "min": z0 + slide * 0.5}, value(ball, "body.velocity", [0.0, 0.0, 0.0], 0.01)]
    return w, text + ".", checks, ref


def _player(rng, w, name: str, x: float) -> float:
    """A box player at (x, 0.5, 0); returns its half width."""
    apply(w, [entity(name), comp(name, "mesh", {"geometry": "box"}), comp(name, "material", {"color": "#2f6fd6"}),
              comp(name, "transform", {"position": [x, 0.5, 0.0]})])
    return 0.5


@register("controls")
def controls(rng, d):
    w = stage()
    player = words(rng, 1, 2, 2)[0]
    x0 = float(rng.choice((-3, -2.5, -2)))
    _player(rng, w, player, x0)
    speed = float(rng.choice((1.5, 2, 3)))
    keys = "wasd" if d == 2 else "arrows"
    right, up = ("d", "w") if keys == "wasd" else ("ArrowRight", "ArrowUp")
    ref = [comp(player, "controls", {"keys": keys, "speed": speed})]
    text = (f"Let the user move `{player}` with the {'W A S D' if keys == 'wasd' else 'arrow'} keys at {speed:g} units per second "
            f"(up moves away from the camera, along -z).")
    checks = [value(player, "controls.speed", speed, 0.01),
              {"op": "key", "key": right, "hold": 1.0, "name": player, "path": "position.0", "expect": x0 + speed, "tol": 0.06},
              {"op": "key", "key": up, "hold": 0.5, "name": player, "path": "position.2", "expect": -speed / 2, "tol": 0.06}]
    if d == 3:
        wall = words(rng, 1, 2, 2, avoid=[player])[0]
        wx = round(x0 + speed + 1.5, 2)
        apply(w, [entity(wall), comp(wall, "mesh", {"geometry": "box", "size": [0.4, 1.5, 6]}),
                  comp(wall, "transform", {"position": [wx, 0.75, 0.0]})])
        ref += [comp(player, "collider", {"shape": "box", "size": [1, 1, 1]}), comp(wall, "collider", {"shape": "box", "size": [0.4, 1.5, 6]})]
        limit = wx - 0.2 - 0.5
        checks.append({"op": "key", "key": right, "hold": 3.0, "name": player, "path": "position.0", "min": limit - 0.1, "max": limit + 0.01})
        text += f" `{wall}` must stop it: give both box colliders matching their meshes ({player} 1 x 1 x 1, {wall} 0.4 x 1.5 x 6)."
    return w, text, checks + [visible(player)], ref


@register("hud")
def hud(rng, d):
    w = stage()
    label = words(rng, 1, 2, 2)[0]
    corner = rng.choice(("top-left", "top-right", "bottom-left", "bottom-right"))
    if d < 3:
        msg = rng.choice(("Level 1", "Ready?", "Find the exit", "Collect them all", "Press arrows to move", "Welcome"))
        values = {"text": msg, "corner": corner}
        text = f"Show the text `{msg}` in the {corner.replace('-', ' ')} corner of the screen, as an entity named `{label}` with a hud component"
        checks = [{"op": "hud", "contains": msg}, value(label, "hud.corner", corner)]
        if d == 2:
            size = float(rng.choice((20, 24, 28)))
            values["size"] = size
            text += f", {size:g} pixels high"
            checks.append(value(label, "hud.text", msg))
        ref = [entity(label), comp(label, "hud", values)]
        return w, text + ".", checks, ref
    player = words(rng, 1, 2, 2, avoid=[label])[0]
    coin = words(rng, 1, 2, 2, avoid=[label, player])[0]
    _player(rng, w, player, -3.0)
    apply(w, [comp(player, "controls", {"speed": 3.0}), entity(coin), comp(coin, "asset", {"name": "coin"}),
              comp(coin, "transform", {"position": [-1.0, 0.0, 0.0]})])
    points = int(rng.choice((1, 5, 10)))
    ref = [comp(coin, "pickup", {"points": points}), entity(label), comp(label, "hud", {"text": "Score: {score}", "corner": corner})]
    text = (f"`{player}` moves with the arrow keys. Make `{coin}` a pickup worth {points} points, and show the score as "
            f"`Score: N` in the {corner.replace('-', ' ')} corner (an entity `{label}` with a hud component; "
            "the text `{score}` in a hud shows the current score).")
    checks = [{"op": "hud", "contains": "Score: 0"},
              {"op": "key", "key": "ArrowRight", "hold": 1.0, "name": coin, "path": "pickup.taken", "expect": True},
              {"op": "hud", "contains": f"Score: {points}"}]
    return w, text, checks, ref


@register("scripting")
def scripting(rng, d):
    w = stage()
    (name, _, pos, _), = place(rng, w, words(rng, 1, 2, 2))
    axis = rng.choice("xz") if d != 2 else rng.choice("xyz")
    i = _AXES.index(axis)
    text = f"Add a script component to `{name}` (the body of function(self, dt, ctx), run every frame; self is its Three.js object) that "
    if d == 1:
        speed = float(rng.choice((0.5, 1, 1.5)))
        src = f"self.position.{axis} += {speed:g} * dt;"
        text += f"moves it along +{axis} at {speed:g} units per second."
        checks = [_after(name, f"position.{i}", 1.0, round(pos[i] + speed, 4), 0.02)]
    elif d == 2:
        rate = float(rng.choice((30, 45, 90)))
        src = f"self.rotation.{axis} += {rate:g} * Math.PI / 180 * dt;"
        text += f"turns it about its {axis} axis at {rate:g} degrees per second."
        checks = [{"op": "spin", "name": name, "axis": axis, "rate": rate, "dt": 1.0, "tol": 0.5}]
    else:
        speed, dist = float(rng.choice((1, 2))), float(rng.choice((1, 1.5)))
        limit = round(pos[i] + dist, 4)
        src = f"self.position.{axis} = Math.min(self.position.{axis} + {speed:g} * dt, {limit:g});"
        text += f"moves it along +{axis} at {speed:g} units per second until {axis} = {limit:g}, where it stops."
        checks = [_after(name, f"position.{i}", 0.25, round(pos[i] + speed * 0.25, 4), 0.02),
                  _after(name, f"position.{i}", 3.0, limit, 0.02)]
    checks.append(value(name, "script.error", None))
    return w, text, checks + [visible(name)], [comp(name, "script", {"source": src})]


@register("repair")
def repair(rng, d):
    w = stage()
    placed = place(rng, w, words(rng, pick(d, 1, 2, 2), 2, 2))
    name = placed[0][0]
    kind = rng.choice(("hidden", "dark", "script"))
    others = [n for n, _, _, _ in placed]
    keep = [value(n, "position", p, 0.01) for n, _, p, _ in placed]
    if kind == "hidden":
        wall = words(rng, 1, 2, 2, avoid=others)[0]
        apply(w, [entity(wall), comp(wall, "mesh", {"geometry": "box", "size": [12, 4, 0.3]}),
                  comp(wall, "transform", {"position": [0.0, 2.0, 3.0]})])
        text = f"`{name}` cannot be seen from the camera: something stands in front of it. Fix that without moving the camera or `{name}`."
        return w, text, [visible(n) for n in others] + keep, [Action("list_entities"), Action("remove_entity", {"entity": wall})]
    if kind == "dark":
        w.set_component("ambient", "light", {"intensity": 0.0})
        w.set_component("key_light", "light", {"intensity": 0.0})
        fix = float(rng.choice((1.0, 1.5, 2.0)))
        text = (f"The scene renders almost black. Light it again (the lights are there, but something is off) so that "
                f"{' and '.join(f'`{n}`' for n in others)} can be seen clearly.")
        ref = [Action("list_entities"), comp("key_light", "light", {"intensity": fix}), comp("ambient", "light", {"intensity": 0.5})]
        return w, text, [{"op": "exposure", "min_mean": 50, "max_mean": 220, "min_std": 10}] + [visible(n) for n in others] + keep, ref
    rate = float(rng.choice((30, 45, 60)))
    good = f"self.rotation.y += {rate:g} * Math.PI / 180 * dt;"
    broken = good.replace("rotation", rng.choice(("rotaton", "rotations", "rotate")))
    w.set_component(name, "script", {"source": broken})
    text = (f"The script on `{name}` should turn it about the y axis at {rate:g} degrees per second, but the page reports an "
            "error. Fix the script.")
    checks = [{"op": "spin", "name": name, "axis": "y", "rate": rate, "dt": 1.0, "tol": 0.5}, value(name, "script.error", None)]
    return w, text, checks + [visible(name)] + keep, [Action("list_entities"), comp(name, "script", {"source": good})]
