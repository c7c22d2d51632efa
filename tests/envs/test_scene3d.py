"""scene3d: the ECS world, the Three.js export and the browser verifier (a real headless Chromium,
one per module), and the family's oracle and null agents."""

from __future__ import annotations

import json
import time

import pytest

from longhaul.envs.scene3d import SUBFAMILIES, make_split, make_task
from longhaul.envs.scene3d.browser import ORIGIN
from longhaul.envs.scene3d.env import SceneEnv
from longhaul.envs.scene3d.export import export_project
from longhaul.envs.scene3d.verify import verify_project, verify_world
from longhaul.envs.scene3d.world import World
from longhaul.envs.tools import format_call
from longhaul.errors import LonghaulError


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
    (lambda w: w.set_component("crate", "instances", {"positions": [[0, 0, 0], [1, 2]]}), r"positions\[1\] must be a list of 3"),
    (lambda w: w.set_component("crate", "instances", {"positions": [[0, 0, 0]] * 1001}), "at most 1000 positions"),
    (lambda w: w.set_component("crate", "asset", {"name": "teapot"}), "search_assets"),
    (lambda w: w.set_component("crate", "hud", {"text": "two\nlines"}), "one line"),
    (lambda w: w.set_component("crate", "script", {"source": "x" * 5000}), "at most 4000 characters"),
    (lambda w: w.set_component("crate", "body", {"type": "floating"}), "dynamic, static, kinematic"),
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


def test_a_missing_module_fails_at_once_naming_it(pool, tmp_path):
    project = export_project(_scene(), tmp_path / "p")
    (project / "sim.js").unlink()
    t0 = time.perf_counter()
    report = verify_project(project, [{"op": "exists", "name": "crate"}], timeout_s=20, pool=pool)
    assert time.perf_counter() - t0 < 8 and not report.passed
    assert all("sim.js answered 404" in r.reason for r in report.results), report.summary()


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
    report = verify_project(project, [{"op": "exists", "name": "crate"}], timeout_s=4, pool=pool)
    took = time.perf_counter() - t0
    assert not report.passed and took < 20, (took, report.summary())
    assert verify_world(_scene(), [{"op": "exists", "name": "crate"}], pool=pool).passed  # the pool recovers


def _ball(w: World, name: str, at, radius: float = 0.5, **body) -> None:
    w.create_entity(name)
    w.set_component(name, "mesh", {"geometry": "sphere", "radius": radius})
    w.set_component(name, "transform", {"position": at})
    w.set_component(name, "body", {"type": "dynamic", **body})
    w.set_component(name, "collider", {"shape": "sphere", "radius": radius, "restitution": 0.3})


def test_bodies_fall_bounce_and_rest_on_colliders(pool):
    w = _scene()
    _ball(w, "ball", [-2, 4, 0])
    _ball(w, "held", [2, 4, 0], gravity=False)
    w.create_entity("shelf")
    w.set_component("shelf", "transform", {"position": [0, 1, 0]})
    w.set_component("shelf", "collider", {"size": [2, 0.2, 2]})
    _ball(w, "onshelf", [0, 3, 0], radius=0.3)
    checks = [{"op": "after", "dt": 0.3, "name": "ball", "path": "position.1", "min": 2.9, "max": 3.7},  # falling, not yet landed
              {"op": "after", "dt": 3.7, "name": "ball", "path": "position", "expect": [-2, 0.5, 0], "tol": 1e-6},
              {"op": "value", "name": "ball", "path": "body.velocity", "expect": [0, 0, 0], "tol": 1e-9},
              {"op": "value", "name": "held", "path": "position", "expect": [2, 4, 0], "tol": 1e-9},
              {"op": "value", "name": "onshelf", "path": "position.1", "expect": 1.1 + 0.3, "tol": 1e-6}]
    report = verify_world(w, checks, pool=pool)
    assert report.passed, report.summary()


def test_keys_move_a_player_until_a_wall_and_pickups_count(pool):
    w = _scene()
    w.create_entity("hero")
    w.set_component("hero", "mesh", {})
    w.set_component("hero", "transform", {"position": [-3, 0.5, 0]})
    w.set_component("hero", "controls", {"speed": 2})
    w.set_component("hero", "collider", {})
    w.create_entity("wall")
    w.set_component("wall", "transform", {"position": [1, 0.5, 0]})
    w.set_component("wall", "collider", {"size": [0.2, 1, 4]})
    w.create_entity("gem")
    w.set_component("gem", "asset", {"name": "coin"})
    w.set_component("gem", "transform", {"position": [-2, 0, 0]})
    w.set_component("gem", "pickup", {"points": 5})
    w.create_entity("score")
    w.set_component("score", "hud", {"text": "Score: {score}", "corner": "top-right"})
    checks = [{"op": "hud", "contains": "Score: 0"},
              {"op": "key", "key": "ArrowRight", "hold": 1.0, "name": "hero", "path": "position", "expect": [-1, 0.5, 0], "tol": 1e-6},
              {"op": "hud", "contains": "Score: 5"},
              {"op": "value", "name": "gem", "path": "visible", "expect": False},
              {"op": "key", "key": "d", "hold": 1.0, "name": "hero", "path": "position.0", "expect": -1, "tol": 1e-6},  # arrows only
              {"op": "key", "key": "ArrowRight", "hold": 5.0, "name": "hero", "path": "position.0", "min": 0.4 - 2 / 60, "max": 0.4 + 1e-6}]
    report = verify_world(w, checks, pool=pool)
    assert report.passed, report.summary()
    r = _by_check(verify_world(w, [{"op": "hud", "contains": "Score: 9"}], pool=pool))
    assert not r["hud 'Score: 9'"].passed and "the HUD shows ['Score: 0']" in r["hud 'Score: 9'"].reason


def test_shadow_exposure_and_budget_checks(pool):
    w = _scene()
    w.create_entity("floor")
    w.set_component("floor", "mesh", {"geometry": "plane", "size": [10, 10, 1]})
    w.set_component("floor", "transform", {"rotation": [-90, 0, 0], "position": [0, -0.5, 0]})
    shadow = {"op": "shadow", "name": "sun", "min_pixels": 40}
    r = _by_check(verify_world(w, [shadow, {"op": "exposure", "min_mean": 20}, {"op": "budget", "max_calls": 10}], pool=pool))
    assert r["shadow sun"].passed and r["exposure"].passed and r["budget"].passed, [x.reason for x in r.values()]
    w.set_component("sun", "light", {"cast_shadow": False, "intensity": 0})
    r = _by_check(verify_world(w, [shadow, {"op": "exposure", "min_mean": 60}], pool=pool))
    assert "does not cast shadows" in r["shadow sun"].reason and "mean luminance" in r["exposure"].reason and not r["exposure"].passed


def test_huge_mesh_fails_its_budget(pool):
    w = _scene()
    w.create_entity("crowd")
    w.set_component("crowd", "asset", {"name": "snowman"})
    w.set_component("crowd", "instances", {"positions": [[i % 20 - 10, 0, -(i // 20)] for i in range(200)]})
    r = _by_check(verify_world(w, [{"op": "budget", "max_calls": 10, "max_triangles": 100_000, "frames": 1},
                                   {"op": "value", "name": "crowd", "path": "instances", "expect": 200}], pool=pool))
    assert r["value crowd.instances"].passed
    assert not r["budget"].passed and "over budget: triangles" in r["budget"].reason and "draw calls" in r["budget"].reason


@pytest.mark.parametrize("source, why", [
    ("self.position.y += undefinedThing * dt;", "undefinedThing is not defined"),
    ("fetch('https://example.com/x');", "request to https://example.com/x failed (net::ERR_BLOCKED_BY_CLIENT"),
    ("this is not javascript", "does not compile"),
])
def test_a_bad_script_fails_with_its_reason(pool, source, why):
    w = _scene()
    w.set_component("crate", "script", {"source": source})
    report = verify_world(w, [{"op": "after", "dt": 0.5, "name": "crate", "path": "script.error", "expect": None},
                              {"op": "exists", "name": "crate"}], pool=pool)
    r = _by_check(report)
    assert not r["no_errors"].passed and why in r["no_errors"].reason, report.summary()
    assert r["exists crate"].passed


def test_a_script_that_never_returns_fails_within_timeout(pool):
    w = _scene()
    w.set_component("crate", "script", {"source": "while (true) {}"})
    t0 = time.perf_counter()
    report = verify_world(w, [{"op": "after", "dt": 0.1, "name": "crate", "path": "position.0", "expect": 0}], timeout_s=3, pool=pool)
    assert not report.passed and time.perf_counter() - t0 < 20 and "did not answer" in report.results[0].reason
    assert verify_world(_scene(), [{"op": "exists", "name": "crate"}], pool=pool).passed  # the pool recovers


def test_every_asset_is_found_by_its_task_phrase():
    from longhaul.envs.scene3d.assets import ASSETS, search
    from longhaul.envs.scene3d.tasks_look import _phrase

    for name in ASSETS:
        assert search(_phrase(name)).split(":")[0] == name, (name, _phrase(name), search(_phrase(name)))
    assert "needs words" in search("  ") and "no asset matches" in search("zzzz")


# ------------------------------------------------------------------ family --

def test_splits_are_deterministic_and_disjoint():
    a, b = make_split("train", 8), make_split("train", 8)
    assert [t.task_id for t in a] == [t.task_id for t in b] and a[3].checks == b[3].checks
    held = make_split("heldout", 8)
    assert not {t.task_id for t in a} & {t.task_id for t in held}
    assert {t.subfamily for t in make_split("train", 80)} == set(SUBFAMILIES) and len(SUBFAMILIES) >= 10


def _run_agent(env, task, oracle: bool):
    env.reset(task)
    for action in task.reference if oracle else ():
        out = env.step(action.text())
        assert not out.observations[0]["content"].startswith("error"), out.observations
    assert env.step(format_call("submit")).terminated
    score = env.verify()
    assert score.passed == oracle, (task.task_id, oracle, env.report.summary())


@pytest.mark.parametrize("sub", sorted(SUBFAMILIES))
def test_oracle_passes_and_null_fails(pool, sub):
    env = SceneEnv(pool=pool)
    _run_agent(env, make_task(11, 3, sub), oracle=True)
    _run_agent(env, make_task(11, 1, sub), oracle=False)


@pytest.mark.slow
@pytest.mark.parametrize("sub", sorted(SUBFAMILIES))
def test_oracle_passes_and_null_fails_at_every_difficulty(pool, sub):
    env = SceneEnv(pool=pool)
    for seed in (3, 11):
        for difficulty in (1, 2, 3):
            for oracle in (True, False):
                _run_agent(env, make_task(seed, difficulty, sub), oracle)


def test_bad_tool_call_is_an_observation():
    env = SceneEnv()
    env.reset(make_task(0, 1, "materials"))
    out = env.step(format_call("set_component", entity="ground", component="material", values={"roughness": 2}))
    assert out.observations[0]["content"].startswith("error: material.roughness must be between 0 and 1")
    out = env.step(format_call("set_component", entity="ground", component="material"))
    assert "needs the argument 'values'" in out.observations[0]["content"]


def test_demonstrations_pass_and_repairs_really_fail(pool):
    from longhaul.agent.demos import build_demos
    from longhaul.envs.registry import families

    rows = build_demos(families()["scene3d"], 2, variants=("reference", "explore", "repair"), workers=1)
    assert {r["variant"] for r in rows} == {"reference", "explore", "repair"}, [(r["task_id"], r["variant"]) for r in rows]
    for r in rows:
        calls = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        assert '"submit"' in calls[-1]
        if r["repair"]:
            tool_results = [m["content"] for m in r["messages"] if m["role"] == "tool"]
            assert any(t.startswith("error:") for t in tool_results) and r["strategy"] in ("bad_value", "unknown_entity")
        if r["variant"] == "explore":
            assert '"list_entities"' in calls[0] or '"search_docs"' in calls[0]


def test_an_episode_is_replayed_into_its_world():
    from longhaul.envs.scene3d.render import episode_world

    task = make_task(5, 1, "materials")
    msgs = [{"role": "system", "content": "..."}, {"role": "user", "content": task.instruction}]
    msgs += [{"role": "assistant", "content": a.text()} for a in task.reference] + [{"role": "assistant", "content": format_call("submit")}]
    msgs.append({"role": "assistant", "content": format_call("remove_entity", entity="ground")})  # after submit: not applied
    world = episode_world(task, msgs)
    target = task.reference[-1].args
    assert world.component(target["entity"], "material") == {"metalness": 0.0, **target["values"]}
    assert "ground" in world.entities
