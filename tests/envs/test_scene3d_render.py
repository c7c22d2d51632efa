"""scene3d screenshots: `render.screenshot` / `render_task` through a real headless Chromium (one per
module), and `longhaul scene render` through the real command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from longhaul.envs.scene3d import VERSION, make_task
from longhaul.envs.scene3d.export import export_project
from longhaul.envs.scene3d.render import render_task, screenshot
from longhaul.envs.scene3d.world import World
from longhaul.errors import LonghaulError
from tests.cli_main import run_main as run_cli
from tests.envs.conftest import needs_browser

SIZE = (640, 480)  # the canvas as displayed (drawn at 320x240)


def _pixels(path: Path) -> np.ndarray:
    """(H, W, 3) uint8 of a PNG file."""
    image = pytest.importorskip("PIL.Image", reason="Pillow decodes the PNGs (pip install -e '.[test]' brings it)")
    with image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB"))


def _changed(a: np.ndarray, b: np.ndarray) -> int:
    """Pixels where some channel differs by more than 8 of 255 (the runtime's own threshold)."""
    return int((np.abs(a.astype(int) - b.astype(int)) > 8).any(axis=-1).sum())


def _spinner() -> World:
    w = World()
    w.create_entity("cam")
    w.set_component("cam", "transform", {"position": [0, 2, 4]})
    w.set_component("cam", "camera", {"look_at": [0, 0, 0]})
    w.create_entity("sun")
    w.set_component("sun", "light", {"type": "directional"})
    w.set_component("sun", "transform", {"position": [3, 6, 4]})
    w.create_entity("slab")
    w.set_component("slab", "mesh", {"geometry": "box", "size": [2.5, 0.3, 0.6]})
    w.set_component("slab", "behaviour", {"axis": "y", "rate": 90})
    return w


# ------------------------------------------------------------------ library --

def test_solved_composition_is_a_real_picture(pool, tmp_path):
    out = render_task(make_task(17, 2, "composition"), tmp_path / "shots" / "solved.png", solved=True, pool=pool)
    assert out == tmp_path / "shots" / "solved.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    px = _pixels(out)
    assert px.shape == (SIZE[1], SIZE[0], 3), px.shape
    colours = len(np.unique(px.reshape(-1, 3), axis=0))
    assert colours > 20, f"{colours} distinct colours: a flat picture"
    assert not list(out.parent.glob(".*.tmp")), "the temporary file was left behind"


def test_start_and_solved_worlds_differ(pool, tmp_path):
    task = make_task(17, 2, "composition")
    start = _pixels(render_task(task, tmp_path / "start.png", pool=pool))
    solved = _pixels(render_task(task, tmp_path / "solved.png", solved=True, pool=pool))
    changed = _changed(start, solved)
    assert changed > 500, f"only {changed} pixels differ between the start and the solved scene"


def test_advancing_the_clock_turns_a_spinner(pool, tmp_path):
    still = _pixels(render_task(_spinner(), tmp_path / "t0.png", pool=pool))
    turned = _pixels(render_task(_spinner(), tmp_path / "t1.png", pool=pool, advance_s=0.5))  # 45 degrees
    again = _pixels(render_task(_spinner(), tmp_path / "t0b.png", pool=pool))
    assert _changed(still, again) == 0, "the same scene at the same time rendered differently"
    assert _changed(still, turned) > 500


@pytest.mark.parametrize("break_it, first_error", [
    (lambda p: (p / "runtime.js").write_text("throw new Error('boom at start');\n" + (p / "runtime.js").read_text()), "boom at start"),
    (lambda p: (p / "three.module.js").unlink(), "three.module.js answered 404"),
    (lambda p: (p / "scene.json").write_text("{"), "JSON"),
])
def test_a_page_that_does_not_build_raises_its_first_error(pool, tmp_path, break_it, first_error):
    project = export_project(_spinner(), tmp_path / "p")
    break_it(project)
    with pytest.raises(LonghaulError, match=first_error) as e:
        screenshot(project, tmp_path / "x.png", pool, timeout_s=20)
    assert "\n" not in str(e.value) and not (tmp_path / "x.png").exists()


def test_a_world_has_no_solution():
    with pytest.raises(LonghaulError, match="--solved needs a task id"):
        render_task(_spinner(), Path("unused.png"), solved=True)


# ------------------------------------------------------------------ command --

def test_cli_renders_a_task_id(tmp_path):
    needs_browser()
    r = run_cli("scene", "render", f"scene3d/v{VERSION}/composition/d2/17", "--out", "shot.png", "--solved", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "shot.png"
    assert (tmp_path / "shot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_renders_a_project_folder(pool, tmp_path):
    project = export_project(_spinner(), tmp_path / "p")
    r = run_cli("scene", "render", str(project), "--out", str(tmp_path / "p.png"), "--time", "0.5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _changed(_pixels(tmp_path / "p.png"), _pixels(render_task(_spinner(), tmp_path / "ref.png", pool=pool, advance_s=0.5))) == 0


@pytest.mark.parametrize("target, pattern", [
    ("no/such/folder", "'no/such/folder' does not exist; pass a project folder"),
    ("scene3d/v0/composition/d2/17", f"use scene3d/v{VERSION}/"),
    (f"scene3d/v{VERSION}/composition/d9/17", "use one of 1, 2, 3"),
    (f"scene3d/v{VERSION}/teapots/d2/17", "no sub-family 'teapots'"),
    (".", "has no scene.json"),
])
def test_cli_bad_target_is_one_line(tmp_path, target, pattern):
    r = run_cli("scene", "render", target, "--out", "x.png", cwd=tmp_path)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout and not (tmp_path / "x.png").exists()


def test_pipeline_pictures_the_shown_episodes_and_the_report_embeds_them(tmp_path):
    import json

    from longhaul.config import PipelineConfig
    from longhaul.envs.tools import format_call
    from longhaul.eval.pipeline_report import (
        picture_path,
        shown_episodes,
        write_pipeline_report,
    )
    from longhaul.runtime.pipeline import Pipeline

    needs_browser()
    cfg = PipelineConfig(name="p", output_dir=str(tmp_path), families=["scene3d"], stages=[],
                         eval={"tasks": 2, "humaneval": False, "show": 1})
    pipe = Pipeline(cfg)
    pipe.dir.mkdir(parents=True)
    tasks = pipe.eval_sets()["scene3d"]
    for stage, solve in (("base", False), ("sft", True)):
        eps = []
        for t in tasks:
            calls = [a.text() for a in t.reference] if solve else []
            msgs = [{"role": "user", "content": t.instruction}] + [{"role": "assistant", "content": c} for c in calls + [format_call("submit")]]
            eps.append({"task_id": t.task_id, "passed": solve, "status": "pass" if solve else "fail", "messages": msgs})
        (tmp_path / "p" / f"episodes_{stage}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    assert pipe.pictures(["base", "sft"]) == 2
    (tid, _, _), = shown_episodes(pipe.dir, ["base", "sft"], 1)
    before, after = (_pixels(picture_path(pipe.dir, s, tid)) for s in ("base", "sft"))
    assert _changed(before, after) > 100  # the solved scene differs from the untouched one
    summary = {"config": cfg.model_dump(mode="json"), "stages": {}, "by_set": {}, "measured_at": "now", "timing_s": {}}
    page = write_pipeline_report(pipe.dir, {**summary, "stages": {"base": _row(), "sft": _row()}}).read_text()
    assert page.count("<img src='pictures/") == 2


def _row() -> dict:
    return {"passed": 0, "n": 2, "pass_rate": 0.0, "ci95": [0.0, 0.5], "agent": None}
