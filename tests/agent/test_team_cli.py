"""`longhaul team run` through the real command: per-role trajectories as JSONL, the summary,
and one error line (with nothing written) for a workflow that is refused."""

import json

from longhaul.types import Trajectory
from tests.cli_main import run_main


def run_cli(*args, cwd):
    return run_main("team", "run", *args, cwd=cwd)


def test_team_run_writes_per_role_trajectories_and_a_summary(tmp_path):
    out = tmp_path / "team.jsonl"
    r = run_cli("--workflow", "coder_tester", "--family", "bugfix", "--n", "2", "--policy", "scripted", "--out", str(out),
                "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert (res["episodes"], res["passed"], res["pass_rate"], res["infra_errors"]) == (2, 2, 1.0, 0)
    assert set(res["roles"]) == {"tester", "coder"} and res["roles"]["coder"]["turns"] == 2
    rows = [Trajectory.from_dict(json.loads(line)) for line in out.read_text().splitlines()]
    assert [t.info["role"] for t in rows] == ["tester", "coder"] * 2
    assert rows[0].info["episode"] == rows[1].info["episode"] != rows[2].info["episode"]
    assert all(t.reward == 1.0 and t.info["policy"] in ("tester", "coder") for t in rows)
    assert not [p for p in tmp_path.iterdir() if p.name != "team.jsonl"]  # no temp file left beside it


def test_a_refused_workflow_is_one_line_and_writes_nothing(tmp_path):
    plugin = tmp_path / "wf.yaml"
    plugin.write_text("name: loop\nroles:\n  - {name: a, policy: p, tools: [read_file, message], system: A}\n"
                      "order: {kind: graph, start: a, edges: [{from: a, to: a}]}\n")
    r = run_cli("--workflow", str(plugin), "--out", str(tmp_path / "x.jsonl"), cwd=tmp_path)
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == ("error: workflow 'loop': the turn graph has no end: no edge from a role reachable from 'a' goes to "
                        "'end'; add one, e.g. {from: ROLE, to: end, when: submit}")
    assert not (tmp_path / "x.jsonl").exists()
