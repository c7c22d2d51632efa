"""The scene3d verifier: load an exported project in headless Chromium and run checks on the live
scene, each passing or failing with a reason; the score is the fraction that pass.

Checks are JSON dicts (they live on the task):
- `{"op": "exists", "name": N}`: the scene has an object named N;
- `{"op": "value", "name": N, "path": "material.color", "expect": V, "tol": T}`: a live value of N
  (`kind`, `parent`, `position`, `rotation` (degrees), `scale`, `material.*`, `mesh.*`, `light.*`,
  `camera.*`, as the runtime's `inspect` gives them) equals V (numbers and vectors within T,
  colours within T per 0..255 channel, strings ignoring case);
- `{"op": "drawn", "min_fraction": F}`: the content changes at least F of the canvas against the
  bare background (a blank or black-on-nothing canvas fails);
- `{"op": "visible", "name": N, "min_pixels": P}`: hiding N changes at least P pixels of the frame
  (so N is in frame, lit or not, and not hidden behind something);
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
    if op == "value":
        return f"value {check.get('name')}.{check.get('path')}"
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


def _session(ctx, checks: list[dict], load_ms: float) -> list[CheckResult]:
    from playwright.sync_api import Error as PlaywrightError

    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console error: {m.text}") if m.type == "error" else None)
    page.set_default_timeout(load_ms)
    labels = [label(c) for c in checks] + ["no_errors"]
    try:
        page.goto(ORIGIN + "index.html?verify", wait_until="load")
        page.wait_for_function("() => window.__scene !== undefined || (window.__errors || []).length > 0")
        ready = page.evaluate("() => window.__scene !== undefined")
    except PlaywrightError as e:
        why = str(e).strip().splitlines()[0][:200]
        return [CheckResult(lb, False, f"the page did not load ({why}); {'; '.join(errors[:2])}".rstrip("; ")) for lb in labels]
    errors += page.evaluate("() => window.__errors || []")
    if not ready:
        why = "; ".join(errors[:3]) or "window.__scene never appeared"
        return [CheckResult(lb, False, f"the scene was not built: {why}") for lb in labels]
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
        if not isinstance(got, dict) or part not in got:
            return False, f"{name} has no {check['path']} (it is a {info['kind']})"
        got = got[part]
    ok = _close(got, check["expect"], check.get("tol", 1e-3))
    return ok, f"{check['path']} is {_show(got)}, {'as' if ok else 'want'} {_show(check['expect'])}"


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


_CHECKS = {"exists": _exists, "value": _value, "drawn": _drawn, "visible": _visible, "spin": _spin}
