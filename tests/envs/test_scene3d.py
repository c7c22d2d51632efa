"""scene3d: the ECS world, the Three.js export and the browser verifier (a real headless Chromium,
one per module), and the family's oracle and null agents."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from longhaul.envs.scene3d import SUBFAMILIES, make_split, make_task
from longhaul.envs.scene3d.browser import ORIGIN, BrowserPool, chromium_path
from longhaul.envs.scene3d.env import SceneEnv
from longhaul.envs.scene3d.export import export_project, three_build_dir
from longhaul.envs.scene3d.verify import verify_project, verify_world
from longhaul.envs.scene3d.world import World
from longhaul.envs.tools import format_call
from longhaul.errors import LonghaulError


def _needs_browser():
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright is not installed; pip install -e '.[scene3d]'")
    try:
        chromium_path(), three_build_dir()
    except LonghaulError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def pool():
    _needs_browser()
    p = BrowserPool()
    yield p
    p.drop()


def _scene(spin_rate: float = 30.0) -> World:
    w = World()
    w.create_entity("cam")
    w.set_component("cam", "transform", {"position": [0, 3, 8]})
    w.set_component("cam", "camera", {"look_at": [0, 0, 0]})
    w.create_entity("sun")
    w.set_component("sun", "light", {"type": "directional", "cast_shadow": True})
    w.set_component("sun", "transform", {"position": [3, 6, 4]})
    w.create_entity("crate")
    w.set_component("crate", "mesh", {"geometry": "box"})
    w.set_component("crate", "material", {"color": "#d03a2c", "roughness": 0.4})
    w.set_component("crate", "behaviour", {"axis": "y", "rate": spin_rate})
    w.create_entity("lid", parent="crate")
    w.set_component("lid", "transform", {"position": [0, 0.6, 0]})
    return w


def _by_check(report) -> dict:
    return {r.check: r for r in report.results}


# ------------------------------------------------------------------ world --

def test_snapshot_restore_round_trip():
    w = _scene()
    snap = w.snapshot()
    back = World.restore(json.loads(json.dumps(snap)))
    assert back.snapshot() == snap
    assert back.get("lid").parent == "crate"
    assert back.component("crate", "transform") is None and back.component("crate", "material")["color"] == "#d03a2c"
    assert back.remove_entity("crate") == ["crate", "lid"]


@pytest.mark.parametrize("edit, fix", [
    (lambda w: w.set_component("crate", "material", {"color": "red"}), "hex colour"),
    (lambda w: w.set_component("crate", "mesh", {"geometry": "teapot"}), "box, sphere, plane, cylinder"),
    (lambda w: w.set_component("ghost", "mesh", {}), "create it with create_entity"),
    (lambda w: w.set_component("crate", "transform", {"position": [1, 2]}), "list of 3 numbers"),
    (lambda w: w.set_component("crate", "physics", {}), "choose one of"),
    (lambda w: w.create_entity("crate"), "already exists"),
])
def test_bad_edits_name_the_fix(edit, fix):
    w = _scene()
    before = w.snapshot()
    with pytest.raises(LonghaulError, match=fix):
        edit(w)
    assert w.snapshot() == before


# ------------------------------------------------------------------ export + verify --

def test_export_loads_offline_and_passes_checks(pool, tmp_path):
    project = export_project(_scene(), tmp_path / "p")
    assert {"index.html", "scene.json", "runtime.js", "three.module.js"} <= {p.name for p in project.iterdir()}
    checks = [{"op": "exists", "name": "lid"},
              {"op": "value", "name": "lid", "path": "parent", "expect": "crate"},
              {"op": "value", "name": "crate", "path": "material.color", "expect": "#d03a2c", "tol": 2},
              {"op": "value", "name": "sun", "path": "light.cast_shadow", "expect": True},
              {"op": "drawn"}, {"op": "visible", "name": "crate"},
              {"op": "spin", "name": "crate", "axis": "y", "rate": 30, "dt": 0.5}]
    report = verify_project(project, checks, pool=pool)
    assert report.passed, report.summary()


def test_network_is_blocked(pool, tmp_path):
    project = export_project(_scene(), tmp_path / "p")

    def probe(ctx):
        page = ctx.new_page()
        page.goto(ORIGIN + "index.html?verify")
        return page.evaluate("() => fetch('https://example.com/').then(() => 'reached', () => 'blocked')")

    assert pool.run(probe, project, 30) == "blocked"


def test_blank_canvas_fails_render_check(pool):
    w = World()
    w.create_entity("cam")
    w.set_component("cam", "camera", {})
    r = _by_check(verify_world(w, [{"op": "drawn"}], pool=pool))
    assert not r["drawn"].passed and "blank" in r["drawn"].reason
    assert r["no_errors"].passed, r["no_errors"].reason


def test_missing_object_fails_scene_graph_check(pool):
    w = _scene()
    w.remove_entity("lid")
    report = verify_world(w, [{"op": "exists", "name": "lid"}, {"op": "visible", "name": "lid"}, {"op": "exists", "name": "crate"}], pool=pool)
    r = _by_check(report)
    assert not r["exists lid"].passed and "no object named 'lid'" in r["exists lid"].reason
    assert not r["visible lid"].passed and r["exists crate"].passed
    assert report.score == pytest.approx(2 / 4)


def test_object_out_of_frame_fails_visible_check(pool):
    w = _scene()
    w.set_component("crate", "transform", {"position": [0, 0, 30]})  # behind the camera
    r = _by_check(verify_world(w, [{"op": "visible", "name": "crate"}], pool=pool))
    assert not r["visible crate"].passed and "out of the camera's view" in r["visible crate"].reason


def test_frozen_animation_fails_behaviour_check(pool):
    r = _by_check(verify_world(_scene(spin_rate=0.0), [{"op": "spin", "name": "crate", "axis": "y", "rate": 30, "dt": 0.5}], pool=pool))
    assert not r["spin crate"].passed and "turned 0 deg" in r["spin crate"].reason


def test_script_error_fails(pool, tmp_path):
    project = export_project(_scene(), tmp_path / "p")
    (project / "runtime.js").write_text("throw new Error('boom at start');\n" + (project / "runtime.js").read_text())
    report = verify_project(project, [{"op": "exists", "name": "crate"}], timeout_s=10, pool=pool)
    assert not report.passed and all("boom at start" in r.reason for r in report.results), report.summary()


def test_console_error_after_build_fails(pool, tmp_path):
    project = export_project(_scene(), tmp_path / "p")
    (project / "runtime.js").write_text((project / "runtime.js").read_text() + "\nsetTimeout(() => console.error('late trouble'), 0);\n")
    report = verify_project(project, [{"op": "exists", "name": "crate"}], pool=pool)
    r = _by_check(report)
    assert r["exists crate"].passed and not r["no_errors"].passed and "late trouble" in r["no_errors"].reason


def test_endless_loop_fails_within_timeout(pool, tmp_path):
    project = export_project(_scene(), tmp_path / "p")
    (project / "runtime.js").write_text("while (true) {}\n")
    t0 = time.perf_counter()
    report = verify_project(project, [{"op": "exists", "name": "crate"}], timeout_s=6, pool=pool)
    took = time.perf_counter() - t0
    assert not report.passed and took < 20, (took, report.summary())
    assert verify_world(_scene(), [{"op": "exists", "name": "crate"}], pool=pool).passed  # the pool recovers


# ------------------------------------------------------------------ family --

def test_splits_are_deterministic_and_disjoint():
    a, b = make_split("train", 8), make_split("train", 8)
    assert [t.task_id for t in a] == [t.task_id for t in b] and a[3].checks == b[3].checks
    held = make_split("heldout", 8)
    assert not {t.task_id for t in a} & {t.task_id for t in held}
    assert {t.subfamily for t in make_split("train", 40)} == set(SUBFAMILIES)


@pytest.mark.parametrize("sub", sorted(SUBFAMILIES))
def test_oracle_passes_and_null_fails(pool, sub):
    env = SceneEnv(pool=pool)
    for difficulty in (1, 3):
        task = make_task(11, difficulty, sub)
        for oracle in (True, False):
            env.reset(task)
            for action in task.reference if oracle else ():
                out = env.step(action.text())
                assert not out.observations[0]["content"].startswith("error"), out.observations
            assert env.step(format_call("submit")).terminated
            score = env.verify()
            assert score.passed == oracle, (task.task_id, oracle, env.report.summary())


def test_bad_tool_call_is_an_observation():
    env = SceneEnv()
    env.reset(make_task(0, 1, "materials"))
    out = env.step(format_call("set_component", entity="ground", component="material", values={"roughness": 2}))
    assert out.observations[0]["content"].startswith("error: material.roughness must be between 0 and 1")
    out = env.step(format_call("set_component", entity="ground", component="material"))
    assert "needs the argument 'values'" in out.observations[0]["content"]
