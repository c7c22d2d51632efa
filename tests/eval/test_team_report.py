"""The team report from real team episodes (a scripted coder and tester on a bugfix task in the
real sandbox): each turn in the order the roles took them, with that turn's own messages, the
messages between roles, per-role figures, and the variant comparison."""

import json

from longhaul.agent.team_run import summarize as summarize_roles
from longhaul.config import validate_config
from longhaul.eval.team_report import load_team_episodes, team_turns, write_team_report
from longhaul.runtime.team_train import TeamTrainConfig, compared, episode_rows, summarize
from tests.team_episodes import coder_tester_episode


def test_the_report_shows_a_team_episode_turn_by_turn(tmp_path):
    evals = {}
    for stage, key, fix in (("base", "e0", False), ("rl", "e1", True)):
        task, eps = coder_tester_episode(key, fix)
        (tmp_path / f"episodes_{stage}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in episode_rows(eps)))
        evals[stage] = {**summarize_roles(eps), "stage": stage, "task_ids": [task.task_id],
                        "passed": [bool(e[0].info["passed"]) for e in eps], "scored": [True]}
        (tmp_path / f"eval_{stage}.json").write_text(json.dumps(evals[stage]))
    assert evals["base"]["passed"] == [False] and evals["rl"]["passed"] == [True]

    ep = load_team_episodes(tmp_path, "rl")[task.task_id]
    turns = team_turns(ep)
    assert [(t["turn"], t["role"], t["outcome"]) for t, _ in turns] == [(1, "tester", "yield"), (2, "coder", "submit")]
    assert [m["role"] for m in turns[0][1]] == ["assistant", "tool"] * 2  # the write and the message, each with its output
    assert '"write_file"' in turns[0][1][0]["content"] and '"submit"' in turns[1][1][-2]["content"]
    assert "[tester] tests/test_team.py checks merge." in turns[1][1][0]["content"]  # the coder's turn opens with the news

    cfg = validate_config({"workflow": "coder_tester", "family": "bugfix", "output_dir": str(tmp_path)}, TeamTrainConfig)
    summary = summarize(evals, {"rl": 1.0}, cfg)
    summary["compared"] = {"single": compared(evals, {**summary, "run_dir": str(tmp_path)}, "single")}
    page = write_team_report(tmp_path, summary, show=1).read_text()
    assert page.index("turn 1: tester") < page.index("turn 2: coder") and page.count("turn 1: tester") == 2  # base and rl
    assert "messages between roles" in page and "tests/test_team.py checks merge." in page
    assert "rl vs base: gained 1, lost 0" in page and "rl vs single rl: gained 0, lost 0" in page
    assert "tester: tokens" in page and "coder: messages" in page
    assert not list(tmp_path.glob("*.tmp"))
