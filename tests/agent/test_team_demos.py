"""Verified multi-role demonstrations through the real team runner and sandbox: one row per role,
each in that role's own view, and episodes whose checks fail left out."""

import json

from longhaul.agent import team_demos
from longhaul.agent.team_demos import build_team_demos
from longhaul.envs import get_family
from tests.cli_main import run_main


def by_episode(rows):
    out = {}
    for r in rows:
        out.setdefault(r["episode"], {})[r["role"]] = r
    return out


def test_coder_tester_demos_are_verified_and_per_role():
    rows = build_team_demos(get_family("bugfix"), "coder_tester", 2, variants=("reference", "repair"))
    eps = by_episode(rows)
    assert len(eps) == 4 and all(set(e) == {"tester", "coder"} for e in eps.values())
    for e in eps.values():
        tester, coder = e["tester"], e["coder"]
        assert tester["role_reward"] == 1.0  # its test fails as given and passes once fixed
        sys_t, sys_c = tester["messages"][0]["content"], coder["messages"][0]["content"]
        assert sys_t.startswith("You are the tester") and sys_c.startswith("You are the coder")
        assert "apply_patch" not in sys_t and "submit" not in sys_t and "apply_patch" in sys_c  # each role's own tools
        assert all(m["role"] != "assistant" or '"write_file"' in m["content"] or '"read_file"' in m["content"]
                   or '"message"' in m["content"] for m in tester["messages"])
        assert coder["messages"][-1]["role"] == "assistant" and '"submit"' in coder["messages"][-1]["content"]
        assert any(m["role"] == "user" and "[tester]" in m["content"] for m in coder["messages"])  # the message, as the coder saw it
    assert {r["repair"] for r in rows} == {False, True}


def test_navigator_driver_demos_split_reading_from_doing():
    rows = build_team_demos(get_family("multistep"), "navigator_driver", 2)
    eps = by_episode(rows)
    assert eps and all(set(e) == {"navigator", "driver"} for e in eps.values())
    for e in eps.values():
        nav = [m["content"] for m in e["navigator"]["messages"] if m["role"] == "assistant"]
        assert '"message"' in nav[-1] and "Plan: 1." in nav[-1]
        assert not any('"write_file"' in t or '"run"' in t for t in nav)


def test_an_episode_whose_role_reward_is_zero_is_left_out(monkeypatch):
    # a tester whose test already passes on the buggy code does not discriminate: not a demonstration
    monkeypatch.setattr(team_demos, "team_test", lambda task: ("tests/test_team.py", "def test_nothing():\n    pass\n"))
    assert build_team_demos(get_family("bugfix"), "coder_tester", 2) == []


def test_cli_writes_rows_atomically_and_refuses_in_one_line(tmp_path):
    run = lambda *a: run_main("data", "sft", *a, cwd=tmp_path)  # noqa: E731
    out = tmp_path / "demos.jsonl"
    r = run("multistep", "--workflow", "navigator_driver", "--n", "1", "--variants", "reference", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["role"] for x in rows] == ["navigator", "driver"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demos.jsonl"]
    r = run("humaneval", "--workflow", "coder_tester", "--out", str(tmp_path / "x.jsonl"))
    lines = [line for line in r.stderr.strip().splitlines() if line.startswith("error")]
    assert r.returncode == 2 and lines == ["error: family 'humaneval' is single-turn; team demonstrations (--workflow) need a workspace family"]
    assert not (tmp_path / "x.jsonl").exists()
