"""Pictures of scene3d scenes: a PNG of an exported project's canvas, as the verifier sees it.

`screenshot` loads a project in the shared warm browser (`browser`) with `?verify`, so the clock
stands still until it is advanced, and saves the `#view` canvas (drawn at 320x240, shown at
640x480, so the PNG is 640x480). `render_task` exports a task's start world, or the world its
reference actions make, and screenshots that; `render_target` resolves what `longhaul scene render`
is given (a project folder, a scene.json or a task id).

It checks nothing (see `verify`) and does not animate: one still frame at a chosen time.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from longhaul.envs.scene3d.browser import BrowserPool, shared_pool
from longhaul.envs.scene3d.env import SceneEnv
from longhaul.envs.scene3d.export import export_project
from longhaul.envs.scene3d.family import DIFFICULTIES, SUBFAMILIES, VERSION, make_task
from longhaul.envs.scene3d.verify import open_scene
from longhaul.envs.scene3d.world import World
from longhaul.errors import LonghaulError

TASK_ID = re.compile(r"^scene3d/v(\d+)/([a-z0-9_]+)/d(\d+)/(\d+)$")  # family.make_task's ids: scene3d/v{VERSION}/{sub}/d{difficulty}/{seed}
TARGETS = f"a project folder (index.html + scene.json), a scene.json or a task id like scene3d/v{VERSION}/physics/d2/17"


def screenshot(project: Path, out: Path, pool: BrowserPool | None = None, timeout_s: float = 30.0, advance_s: float = 0.0) -> Path:
    """Save the canvas of the project in folder `project` as the PNG `out` (written atomically), after
    advancing its clock `advance_s` seconds; a page that does not build raises its first error."""
    project, out = Path(project), Path(out)
    missing = [name for name in ("index.html", "scene.json") if not (project / name).is_file()]
    if missing:
        raise LonghaulError(f"{project} is not a scene3d project (no {' or '.join(missing)}); export one with export_project")
    if out.is_dir():
        raise LonghaulError(f"{out} is a folder; give --out a file name like {out / 'shot.png'}")
    load_ms = max(1000.0, timeout_s * 1000 / 2)
    try:
        png = (pool or shared_pool()).run(lambda ctx: _shoot(ctx, load_ms, advance_s), project, timeout_s)
    except TimeoutError as e:
        raise LonghaulError(f"the page of {project} did not answer: {e} (an endless loop?); check its runtime.js") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(png)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _shoot(ctx, load_ms: float, advance_s: float) -> bytes:
    """The job run in the browser's thread: load, wait for the scene, advance, render, capture."""
    page, errors, why = open_scene(ctx, load_ms)
    if why is not None:
        raise LonghaulError(why)
    page.evaluate("(dt) => { window.__scene.advance(dt); window.__scene.render(); }", advance_s)
    return page.locator("#view").screenshot(type="png")


def _replay(task, replies: list[str], strict: bool = False) -> World:
    """The task's start world with `replies` (assistant messages) run through the env's tools, up to
    a submit; with `strict`, a reply whose first result is an error raises."""
    env = SceneEnv()
    env.reset(task)
    for reply in replies:
        if env.submitted:
            break
        obs = env.step(reply).observations
        if strict and obs and obs[0]["content"].startswith("error"):
            raise RuntimeError(f"{task.task_id}: the reference call {reply!r:.80} failed: {obs[0]['content']}")
    return env.world


def solved_world(task) -> World:
    """The world after the task's reference actions, replayed through the env's tools (as the oracle does)."""
    return _replay(task, [a.text() for a in task.reference], strict=True)


def render_task(task_or_world, out: Path, solved: bool = False, pool: BrowserPool | None = None,
                timeout_s: float = 30.0, advance_s: float = 0.0) -> Path:
    """Screenshot a World, or a task's start world (its solved world with `solved`), into the PNG `out`."""
    if isinstance(task_or_world, World):
        if solved:
            raise LonghaulError("--solved needs a task id: a scene on its own has no reference solution")
        world = task_or_world
    else:
        world = solved_world(task_or_world) if solved else World.restore(json.loads(task_or_world.start))
    with tempfile.TemporaryDirectory(prefix="scene3d-render-") as tmp:
        return screenshot(export_project(world, Path(tmp)), out, pool, timeout_s, advance_s)


def episode_world(task, messages: list[dict]) -> World:
    """The world an episode left: the task's start with the episode's assistant replies replayed
    through the env's tools (they are pure edits of the world, so the replay is exact)."""
    return _replay(task, [m.get("content") or "" for m in messages if m.get("role") == "assistant"])


def render_episode(task, messages: list[dict], out: Path, pool: BrowserPool | None = None) -> Path:
    """A PNG of the scene an evaluated episode (its chat messages) built for `task`."""
    return render_task(episode_world(task, messages), out, pool=pool)


def render_target(target: str, out: Path, solved: bool = False, advance_s: float = 0.0, pool: BrowserPool | None = None) -> Path:
    """Render what `longhaul scene render` names: a project folder, a scene.json file or a task id."""
    if m := TASK_ID.match(target):
        return render_task(task_from_id(target, m), out, solved, pool, advance_s=advance_s)
    path = Path(target)
    if not path.exists():
        hint = f" (task ids look like scene3d/v{VERSION}/physics/d2/17)" if target.startswith("scene3d") else ""
        raise LonghaulError(f"{target!r} does not exist{hint}; pass {TARGETS}")
    if path.is_dir() and (path / "index.html").is_file() and (path / "scene.json").is_file():
        if solved:
            raise LonghaulError("--solved needs a task id: a project folder has no reference solution")
        return screenshot(path, out, pool, advance_s=advance_s)
    scene = path / "scene.json" if path.is_dir() else path
    if not scene.is_file():
        raise LonghaulError(f"{target} has no scene.json; pass {TARGETS}")
    return render_task(read_world(scene), out, solved, pool, advance_s=advance_s)


def task_from_id(task_id: str, match: re.Match | None = None):
    """The scene3d task of an id `scene3d/v{VERSION}/{subfamily}/d{difficulty}/{seed}`."""
    m = match or TASK_ID.match(task_id)
    if m is None:
        raise LonghaulError(f"{task_id!r} is not a scene3d task id; write scene3d/v{VERSION}/<sub-family>/d<difficulty>/<seed>")
    version, sub, difficulty, seed = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
    if version != VERSION:
        raise LonghaulError(f"task {task_id} is of version v{version}, but this longhaul makes scene3d v{VERSION}; use scene3d/v{VERSION}/...")
    if sub not in SUBFAMILIES:
        raise LonghaulError(f"task {task_id}: no sub-family {sub!r}; use one of {', '.join(sorted(SUBFAMILIES))}")
    if difficulty not in DIFFICULTIES:
        raise LonghaulError(f"task {task_id} has difficulty {difficulty}; use one of {', '.join(map(str, DIFFICULTIES))}")
    return make_task(seed, difficulty, sub)


def read_world(scene: Path) -> World:
    """The World of a scene.json file (a `World.snapshot()`), or a one-line error."""
    try:
        data = json.loads(Path(scene).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LonghaulError(f"could not read {scene} as JSON ({e}); pass a scene.json written by export_project") from None
    try:
        return World.restore(data)
    except (KeyError, TypeError, AttributeError) as e:
        raise LonghaulError(f"{scene} is not a scene3d snapshot ({type(e).__name__}: {e}); pass a scene.json written by export_project") from None
