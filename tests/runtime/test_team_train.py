"""`longhaul team train` end to end on a tiny random model and the real sandbox: demonstrations,
SFT per role, one GRPO step on team episodes, the three evaluations, per-role metrics, a checkpoint
for every role; and a bad config refused in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from longhaul.config import validate_config
from longhaul.errors import LonghaulError
from longhaul.runtime.team_train import TeamTrainConfig, TeamTrainer, train_team

ROOT = Path(__file__).resolve().parents[2]


def tiny(tmp_path, **over) -> TeamTrainConfig:
    tree = {"name": "team", "output_dir": str(tmp_path), "model": {"name": "tiny-llama", "context_length": 8192},
            "workflow": "navigator_driver", "family": "multistep", "policies": "per_role",
            "demos": {"tasks": 3, "variants": ["reference"]},
            "sft": {"data": {"batch_size": 2}, "train": {"steps": 1, "lr": 1e-3, "micro_batch": 2, "autocast": "none"}},
            "rl": {"rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": 16},
                   "train": {"steps": 1, "micro_batch": 2, "autocast": "none"}},
            "eval": {"tasks": 2, "max_new_tokens": 16}, "isolate": False, **over}
    return validate_config(tree, TeamTrainConfig)


@pytest.mark.slow  # ~30 s: demos, SFT and an RL step of two tiny policies, then of one; the parts have fast tests
def test_a_per_role_team_trains_end_to_end_beside_a_single_agent(tmp_path):
    summary = train_team(tiny(tmp_path, compare=["single"]))
    run = tmp_path / "team"
    single = summary["compared"]["single"]
    page = (run / "report.html").read_text()
    assert "turn 1: navigator" in page and "Variants, on the same held-out tasks" in page and "rl vs single rl" in page
    assert "turn 1: agent" in (run / "single" / "report.html").read_text()
    assert list(single["stages"]) == ["base", "sft", "rl"] and set(single["stages"]["rl"]["roles"]) == {"agent"}
    assert {"rl_vs_single_rl"} == {k for k in single if "_vs_" in k}
    solo_rows = [json.loads(line) for line in (run / "single" / "demos.jsonl").read_text().splitlines()]
    assert solo_rows and {r["role"] for r in solo_rows} == {"agent"}
    assert json.loads((run / "single" / "eval_rl.json").read_text())["task_ids"] == json.loads(
        (run / "eval_rl.json").read_text())["task_ids"]  # paired: the same held-out tasks
    assert list(summary["stages"]) == ["base", "sft", "rl"]
    assert all(row["n"] == 2 and len(row["ci95"]) == 2 for row in summary["stages"].values())
    assert {"sft_vs_base", "rl_vs_sft", "rl_vs_base"} <= set(summary)
    rows = [json.loads(line) for line in (run / "demos.jsonl").read_text().splitlines()]
    assert {r["role"] for r in rows} == {"navigator", "driver"}
    for role in ("navigator", "driver"):  # each role's SFT saw only its own rows
        own = [json.loads(line) for line in (run / f"demos_{role}.jsonl").read_text().splitlines()]
        assert own and {r["role"] for r in own} == {role}
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for role in ("navigator", "driver"):
        assert {f"role/{role}/tokens", f"role/{role}/invalid_calls", f"role/{role}/reward_share"} <= set(m)
        assert f"policy/{role}/loss" in m  # one trainer per role's policy
    manifest = json.loads((run / "rl" / "team.json").read_text())
    assert manifest["policies"] == "per_role" and set(manifest["roles"]) == {"navigator", "driver"}
    assert manifest["roles"]["navigator"] != manifest["roles"]["driver"]
    assert all((Path(p) / "config.json").is_file() for p in manifest["roles"].values())


def test_bad_configs_are_refused_at_load(tmp_path):
    with pytest.raises(LonghaulError, match="policies"):
        tiny(tmp_path, policies="both")
    with pytest.raises(LonghaulError, match="unknown workflow 'pilots'"):
        TeamTrainer(tiny(tmp_path, workflow="pilots"))
    assert TeamTrainer(tiny(tmp_path, budgets={"max_turns": 3, "max_tokens": 500})).wf.max_turns == 3
    with pytest.raises(LonghaulError, match="max_turnz"):
        TeamTrainer(tiny(tmp_path, budgets={"max_turnz": 3}))
    with pytest.raises(LonghaulError, match="rl: .*group_size"):
        TeamTrainer(tiny(tmp_path, rl={"rollout": {"group_size": 1}}))
    with pytest.raises(LonghaulError, match="compare names 'per_role', this run's own policies"):
        tiny(tmp_path, compare=["single", "per_role"])
    with pytest.raises(LonghaulError, match="compare lists a variant twice"):
        tiny(tmp_path, compare=["single", "single"])
    with pytest.raises(LonghaulError, match="drop compare"):
        tiny(tmp_path, solo=True, compare=["shared"])
    single = tiny(tmp_path, compare=["single", "shared"]).variant("single")
    assert single.solo and single.policies == "shared" and single.compare == [] and single.run_dir == tmp_path / "team" / "single"
    assert [r.name for r in TeamTrainer(single).wf.roles] == ["agent"]


def test_the_command_refuses_a_bad_config_in_one_line(tmp_path):
    cfg = tmp_path / "team.yaml"
    cfg.write_text("workflow: coder_tester\nfamily: humaneval\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-m", "longhaul.cli", "team", "train", str(cfg)], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=120)
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == "error: family 'humaneval' is single-turn; a team shares a workspace: choose a workspace family"
    assert not (tmp_path / "runs").exists()
