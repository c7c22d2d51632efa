"""The scene3d verifier: load an exported project in headless Chromium and run checks on the live
scene, each passing or failing with a reason; the score is the fraction that pass.

Checks are JSON dicts (they live on the task) and run in order on one page, so a check sees the
clock and the state the checks before it left:
- `{"op": "exists", "name": N}`: the scene has an object named N;
- `{"op": "value", "name": N, "path": "material.color", "expect": V, "tol": T}`: a live value of N
  (`kind`, `parent`, `position`, `rotation` (degrees), `scale`, `visible`, `material.*`, `mesh.*`,
  `light.*`, `camera.*`, `asset`, `instances` (a count), `hud.text`, `body.*`, `collider.*`,
  `behaviour.*`, `pickup.taken`, as the runtime's `inspect` gives them) equals V (numbers and
  vectors within T, colours within T per 0..255 channel, strings ignoring case); a path part that
  is a number indexes a vector (`position.0` is x); `min` / `max` instead of `expect` bound a number;
- `{"op": "after", "dt": S, ...value fields}`: advance the clock S seconds, then a value check;
- `{"op": "key", "key": K, "hold": S, ...value fields}`: hold key K (a real key event) while the
  clock advances S seconds, release it, then a value check (a player moved, a wall stopped it);
- `{"op": "hud", "contains": TEXT}`: some HUD element shows TEXT;
- `{"op": "drawn", "min_fraction": F}`: the content changes at least F of the canvas against the
  bare background (a blank or black-on-nothing canvas fails);
- `{"op": "visible", "name": N, "min_pixels": P}`: hiding N changes at least P pixels of the frame
  (so N is in frame, lit or not, and not hidden behind something);
- `{"op": "shadow", "name": L, "min_pixels": P}`: light L casts shadows, and they change at least P
  pixels (turning its shadows off changes the frame);
- `{"op": "exposure", "min_mean": A, "max_mean": B, "min_std": C}`: the frame's mean luminance
  (0..255) lies in [A, B] and its spread (contrast) is at least C;
- `{"op": "budget", "max_calls": D, "max_triangles": T, "max_frame_ms": F}`: one frame takes at
  most D draw calls and T triangles, and renders in at most F ms on average over `frames` (5)
  frames (SwiftShader);
- `{"op": "spin", "name": N, "axis": A, "rate": R, "dt": S, "tol": T}`: advancing the clock S
  seconds turns N by R*S degrees about A (within T).
A last check, `no_errors`, fails on any page error, uncaught error or console error. A page that
does not load, throws before the scene exists, or hangs fails every check with that reason within
`timeout_s`. The browser lives in `longhaul.envs.scene3d.browser`.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from longhaul.envs.scene3d.browser import ORIGIN, BrowserPool, shared_pool
from longhaul.envs.scene3d.export import export_project
from longhaul.envs.scene3d.world import World


@dataclass(frozen=True)
class CheckResult:
    check: str  # a short label: "value crate.position"
    passed: bool
    reason: str


@dataclass(frozen=True)
class Report:
    results: tuple[CheckResult, ...]

    @property
    def score(self) -> float:
        return sum(r.passed for r in self.results) / len(self.results) if self.results else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def summary(self) -> str:
        return "\n".join(f"{'PASS' if r.passed else 'FAIL'} {r.check}: {r.reason}" for r in self.results)


def label(check: dict) -> str:
    op = check.get("op", "?")
    if op in ("value", "after"):
        return f"{op} {check.get('name')}.{check.get('path')}"
    if op == "key":
        return f"key {check.get('key')} {check.get('name')}.{check.get('path')}"
    if op == "hud":
        return f"hud {check.get('contains')!r}"
    return f"{op} {check.get('name', '')}".strip()


def verify_world(world: World, checks: list[dict], timeout_s: float = 30.0, pool: BrowserPool | None = None) -> Report:
    """Export `world` to a temporary project and verify it."""
    with tempfile.TemporaryDirectory(prefix="scene3d-") as tmp:
        return verify_project(export_project(world, Path(tmp)), checks, timeout_s, pool)


def verify_project(project: Path, checks: list[dict], timeout_s: float = 30.0, pool: BrowserPool | None = None) -> Report:
    """Run `checks` (and `no_errors`) on the project in `project`; never hangs past `timeout_s` (plus start-up)."""
    labels = [label(c) for c in checks] + ["no_errors"]
    pool = pool or shared_pool()
    load_ms = max(1000.0, timeout_s * 1000 / 2)
    try:
        results = pool.run(lambda ctx: _session(ctx, checks, load_ms), project, timeout_s)
    except TimeoutError as e:
        results = [CheckResult(lb, False, f"the page did not answer: {e} (an endless loop?)") for lb in labels]
    return Report(tuple(results))


def open_scene(ctx, load_ms: float):
    """Load the project in a new page of `ctx` with `?verify` (the clock stands still) and wait for
    its scene: (page, errors, why) where `errors` collects what the page reports from now on
    (uncaught errors, console errors, files answered 4xx, blocked requests) and `why` is None once
    `window.__scene` exists, else the first reason it does not."""
    from playwright.sync_api import Error as PlaywrightError

    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console error: {m.text}") if m.type == "error" and "Failed to load resource" not in m.text
            else None)
    page.on("response", lambda r: errors.append(f"{r.url[len(ORIGIN):] or r.url} answered {r.status}") if r.status >= 400 else None)
    page.on("requestfailed", lambda r: errors.append(f"request to {r.url[:120]} failed ({r.failure}): the page has no network"))
    page.set_default_timeout(load_ms)
    try:
        page.goto(ORIGIN + "index.html?verify", wait_until="load")
        page.wait_for_function("() => window.__scene !== undefined || (window.__errors || []).length > 0")
        ready = page.evaluate("() => window.__scene !== undefined")
    except PlaywrightError as e:
        why = str(e).strip().splitlines()[0][:200]
        return page, errors, f"the page did not load ({why}); {'; '.join(errors[:2])}".rstrip("; ")
    errors += [e for e in page.evaluate("() => window.__errors || []") if e not in errors]
    return page, errors, None if ready else f"the scene was not built: {'; '.join(errors[:3]) or 'window.__scene never appeared'}"


def _session(ctx, checks: list[dict], load_ms: float) -> list[CheckResult]:
    labels = [label(c) for c in checks] + ["no_errors"]
    page, errors, why = open_scene(ctx, load_ms)
    if why is not None:
        return [CheckResult(lb, False, why) for lb in labels]
    out = [_run_check(page, c) for c in checks]
    errors += [e for e in page.evaluate("() => window.__errors") if e not in errors]
    out.append(CheckResult("no_errors", not errors, "; ".join(dict.fromkeys(errors))[:400] if errors else "no errors"))
    return out


def _run_check(page, check: dict) -> CheckResult:
    op, name = check.get("op"), check.get("name")
    fn = _CHECKS.get(op)
    if fn is None:
        return CheckResult(label(check), False, f"unknown check op {op!r}")
    return CheckResult(label(check), *fn(page, check, name))


def _exists(page, check, name):
    info = page.evaluate("(n) => window.__scene.inspect(n)", name)
    return (True, f"{name} is a {info['kind']}") if info else (False, f"no object named {name!r} in the scene")


def _value(page, check, name):
    info = page.evaluate("(n) => window.__scene.inspect(n)", name)
    if info is None:
        return False, f"no object named {name!r} in the scene"
    got = info
    for part in check["path"].split("."):
        if isinstance(got, list) and part.isdigit() and int(part) < len(got):
            got = got[int(part)]
        elif isinstance(got, dict) and part in got:
            got = got[part]
        else:
            return False, f"{name} has no {check['path']} (it is a {info['kind']})"
    if "expect" in check:
        ok = _close(got, check["expect"], check.get("tol", 1e-3))
        return ok, f"{check['path']} is {_show(got)}, {'as' if ok else 'want'} {_show(check['expect'])}"
    lo, hi = check.get("min", -math.inf), check.get("max", math.inf)
    ok = isinstance(got, (int, float)) and not isinstance(got, bool) and lo <= got <= hi
    want = f"at least {lo:g}" if hi == math.inf else f"at most {hi:g}" if lo == -math.inf else f"between {lo:g} and {hi:g}"
    return ok, f"{check['path']} is {_show(got)}, {'as' if ok else 'want'} {want}"


def _after(page, check, name):
    page.evaluate("(dt) => { window.__scene.advance(dt); window.__scene.render(); }", check.get("dt", 1.0))
    ok, why = _value(page, check, name)
    return ok, f"after {check.get('dt', 1.0):g} s: {why}"


def _key(page, check, name):
    key, hold = check["key"], check.get("hold", 1.0)
    page.keyboard.down(key)
    try:
        page.evaluate("(dt) => window.__scene.advance(dt)", hold)
    finally:
        page.keyboard.up(key)
    page.evaluate("() => window.__scene.render()")
    ok, why = _value(page, check, name)
    return ok, f"after holding {key} {hold:g} s: {why}"


def _hud(page, check, name):
    want = check["contains"]
    shown = page.evaluate("() => window.__scene.hud()")
    texts = [h["text"] for h in shown]
    if any(want in t for t in texts):
        return True, f"the HUD shows {want!r}"
    return False, f"no HUD element shows {want!r}; the HUD shows {texts!r:.200}" if texts else "there is no HUD element"


def _close(got, want, tol) -> bool:
    if isinstance(want, bool) or want is None:
        return got == want
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and abs(got - want) <= tol
    if isinstance(want, (list, tuple)):
        return isinstance(got, list) and len(got) == len(want) and all(_close(g, w, tol) for g, w in zip(got, want))
    if isinstance(want, str) and want.startswith("#") and isinstance(got, str) and got.startswith("#"):
        g, w = bytes.fromhex(got[1:]), bytes.fromhex(want[1:])
        return all(abs(a - b) <= max(tol, 2) for a, b in zip(g, w))
    return str(got).lower() == str(want).lower()


def _show(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return repr(v)


def _drawn(page, check, name):
    d = page.evaluate("() => window.__scene.drawn()")
    need = check.get("min_fraction", 0.01)
    frac = d["pixels"] / d["total"]
    if frac >= need:
        return True, f"{d['pixels']} of {d['total']} pixels drawn"
    return False, f"the canvas is blank: {d['pixels']} of {d['total']} pixels differ from the background (want {need:.0%})"


def _visible(page, check, name):
    v = page.evaluate("(n) => window.__scene.visible(n)", name)
    if v is None:
        return False, f"no object named {name!r} in the scene"
    need = check.get("min_pixels", 30)
    where = "its box projects on screen" if v["onScreen"] else "its box is out of the camera's view"
    if v["pixels"] >= need:
        return True, f"{name} covers {v['pixels']} pixels"
    return False, f"{name} covers {v['pixels']} pixels of the frame (want {need}); {where}"


def _spin(page, check, name):
    axis = "xyz".index(check.get("axis", "y"))
    dt = check.get("dt", 0.5)
    before = page.evaluate("(n) => window.__scene.inspect(n)", name)
    if before is None:
        return False, f"no object named {name!r} in the scene"
    page.evaluate("(dt) => { window.__scene.advance(dt); window.__scene.render(); }", dt)
    after = page.evaluate("(n) => window.__scene.inspect(n)", name)
    turned = after["rotation"][axis] - before["rotation"][axis]
    want = check["rate"] * dt
    ok = math.isfinite(turned) and abs(turned - want) <= check.get("tol", 0.5)
    return ok, f"{name} turned {turned:.3g} deg about {check.get('axis', 'y')} in {dt:g} s, {'as' if ok else 'want'} {want:.3g}"


def _shadow(page, check, name):
    s = page.evaluate("(n) => window.__scene.shadow(n)", name)
    if s is None:
        return False, f"no light named {name!r} in the scene"
    need = check.get("min_pixels", 50)
    if not s["casts"]:
        return False, f"{name} does not cast shadows (light.cast_shadow is false)"
    ok = s["pixels"] >= need
    return ok, f"{name}'s shadows cover {s['pixels']} pixels" + ("" if ok else f" (want {need}: does anything cast onto something?)")


def _exposure(page, check, name):
    e = page.evaluate("() => window.__scene.exposure()")
    lo, hi, spread = check.get("min_mean", 40), check.get("max_mean", 215), check.get("min_std", 12)
    why = f"mean luminance {e['mean']:.0f}, spread {e['std']:.0f} (want {lo:g}-{hi:g}, spread at least {spread:g})"
    return lo <= e["mean"] <= hi and e["std"] >= spread, why


def _budget(page, check, name):
    b = page.evaluate("(n) => window.__scene.budget(n)", check.get("frames", 5))
    over = [f"{k} {b[k]:.4g} > {check[m]:g}" for k, m in (("calls", "max_calls"), ("triangles", "max_triangles"),
                                                         ("frame_ms", "max_frame_ms")) if m in check and b[k] > check[m]]
    why = f"{b['calls']} draw calls, {b['triangles']} triangles, {b['frame_ms']:.1f} ms a frame"
    return not over, why + (f"; over budget: {', '.join(over)}" if over else "")


_CHECKS = {"exists": _exists, "value": _value, "after": _after, "key": _key, "hud": _hud, "drawn": _drawn, "visible": _visible,
           "shadow": _shadow, "exposure": _exposure, "budget": _budget, "spin": _spin}
