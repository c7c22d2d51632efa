"""The agent pipeline end to end on a tiny random model: demonstrations, SFT, RL, the three-way
evaluation on the same held-out tasks, the report, a re-run that continues, and bad configs."""

import json
from pathlib import Path

import pytest

from longhaul.config import PipelineConfig, load_config
from longhaul.errors import LonghaulError
from longhaul.runtime.pipeline import Pipeline, run_pipeline


def _cfg(tmp_path, *extra):
    return load_config("examples/tiny_pipeline.yaml", [f"output_dir={tmp_path}", *extra], model=PipelineConfig)


@pytest.mark.slow  # ~45 s: demos, SFT, RL and four evaluations of a tiny model; each stage has fast tests of its own
def test_tiny_pipeline_runs_every_stage_on_the_same_tasks_and_continues(tmp_path):
    cfg = _cfg(tmp_path)
    summary = run_pipeline(cfg)
    run = tmp_path / "tiny_pipeline"
    assert list(summary["stages"]) == ["base", "sft", "rl"]
    ids = [json.loads((run / f"eval_{s}.json").read_text())["terminal"]["task_ids"] for s in ("base", "sft", "rl")]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 4
    transfer = "terminal/fix_perms (held-out sub-family)"
    assert summary["by_set"][transfer]["base"]["n"] == 4 and summary["transfer"]["rl"]["n"] == 4
    rows = [json.loads(x) for x in (run / "demos.jsonl").read_text().splitlines()]
    assert rows and not any(r["subfamily"] == "fix_perms" for r in rows), "a held-out sub-family never reaches training"
    assert {"p_value", "gained", "lost"} <= set(summary["rl_vs_sft"])
    assert 0 <= summary["stages"]["rl"]["mean_reward"] <= 1  # partial credit, kept in eval_<stage>.json and the episodes
    assert all("reward" in json.loads(x) for x in (run / "episodes_base.jsonl").read_text().splitlines())
    assert (run / "sft" / "model" / "config.json").exists() and (run / "rl" / "model" / "config.json").exists()
    # the RL stage's episodes ran audited: each one's sandbox id keys its commands in rl/audit.jsonl
    puts = [json.loads(line) for line in (run / "rl" / "buffer.jsonl").read_text().splitlines()]
    ids = {t["info"]["sandbox"] for p in puts if "group" in p for t in p["group"]}
    audited = [json.loads(line) for line in (run / "rl" / "audit.jsonl").read_text().splitlines()]
    assert ids and ids <= {r.get("episode") or r["sandbox"] for r in audited}
    page = (run / "report.html").read_text()
    assert "Held-out sub-families" in page and "<pre>" in page and "<svg" in page
    first = (run / "eval_rl.json").stat().st_mtime
    again = run_pipeline(cfg)  # every stage's output exists: nothing is trained or evaluated again
    assert (run / "eval_rl.json").stat().st_mtime == first and again["stages"] == summary["stages"]
    stage_s = lambda s: {k: v for k, v in s["timing_s"].items() if k != "total"}  # noqa: E731
    assert stage_s(again) == stage_s(summary), "finished stages keep the seconds they took"
    assert {"demos", "eval_base", "sft", "eval_sft", "rl", "eval_rl"} <= set(summary["timing_s"])
    sets = json.loads((run / "eval_rl.json").read_text())
    episodes = (run / "episodes_rl.jsonl").read_text()
    more = run_pipeline(_cfg(tmp_path, "eval.humaneval=true", "eval.humaneval_tasks=3"))  # HumanEval alone is added
    assert {s: more["humaneval"][s]["n"] for s in more["humaneval"]} == {"base": 3, "rl": 3}
    after = json.loads((run / "eval_rl.json").read_text())
    assert {k: v for k, v in after.items() if k != "humaneval"} == sets and (run / "episodes_rl.jsonl").read_text() == episodes
    assert more["stages"] == summary["stages"] and {"humaneval_base", "humaneval_rl"} <= set(more["timing_s"])


def test_bad_pipeline_configs_get_one_line_errors(tmp_path):
    with pytest.raises(LonghaulError, match="single-turn"):
        Pipeline(_cfg(tmp_path, "families=[funcgen]"))
    with pytest.raises(LonghaulError, match="heldout_subfamilies: 'terminal/nope'"):
        Pipeline(_cfg(tmp_path, "heldout_subfamilies=[terminal/nope]"))
    with pytest.raises(LonghaulError, match="unknown config key 'demos.taks'"):
        _cfg(tmp_path, "demos.taks=3")
    with pytest.raises(LonghaulError, match="pipeline sft: unknown config key 'train.stepz'"):
        Pipeline(_cfg(tmp_path, "sft={train: {stepz: 1}}"))  # at once, not after the base evaluation
    with pytest.raises(LonghaulError, match="pipeline rl: unknown config key 'algo.negative_wieght'"):
        Pipeline(_cfg(tmp_path, "rl={algo: {negative_wieght: 0}}"))  # at once, not after the SFT
    with pytest.raises(LonghaulError, match="has not been validated .* run `longhaul envcheck terminal`"):
        run_pipeline(_cfg(tmp_path, "name=unchecked", "rl={task: {require_envcheck: true}}"))
    assert not (tmp_path / "unchecked" / "demos.jsonl").exists(), "refused before the first stage, not after the SFT"


def test_subfamilies_choose_what_trains_and_stratified_sets_balance_them(tmp_path):
    pipe = Pipeline(_cfg(tmp_path, "subfamilies={terminal: [sort_unique, fix_perms, grep_files]}",
                         "heldout_subfamilies=[terminal/fix_perms]", "eval.tasks=7"))
    assert pipe.allowed("terminal") == ["sort_unique", "grep_files"]
    rl = pipe.rl_config("x")
    assert (rl.task.subfamilies if not rl.domains else rl.domains[0].subfamilies) == ["sort_unique", "grep_files"]
    sets = pipe.eval_sets()
    kinds = [t.task_id.split("/")[2] for t in sets["terminal"]]
    assert kinds == ["sort_unique", "grep_files"] * 3 + ["sort_unique"], "even and interleaved"
    assert len({t.task_id for t in sets["terminal"]}) == 7
    held = sets["terminal/fix_perms (held-out sub-family)"]
    assert len(held) == 7 and {t.task_id.split("/")[2] for t in held} == {"fix_perms"}
    loose = Pipeline(_cfg(tmp_path, "eval.stratify=false", "eval.tasks=7"))
    drawn = loose.families["terminal"].make_split("heldout", 7, 1, loose.allowed("terminal"))
    assert [t.task_id for t in loose.eval_sets()["terminal"]] == [t.task_id for t in drawn], "each task draws its kind"


def test_bad_subfamily_choices_get_one_line_errors(tmp_path):
    with pytest.raises(LonghaulError, match="subfamilies: 'multistep' is not one of the listed families"):
        Pipeline(_cfg(tmp_path, "subfamilies={multistep: [git_restore]}"))
    with pytest.raises(LonghaulError, match=r"subfamilies: terminal: \['nope'\] is not a list of its sub-families"):
        Pipeline(_cfg(tmp_path, "subfamilies={terminal: [nope]}"))
    with pytest.raises(LonghaulError, match="no sub-family left to train on"):
        Pipeline(_cfg(tmp_path, "subfamilies={terminal: [fix_perms]}", "heldout_subfamilies=[terminal/fix_perms]"))


def test_the_main_job_config_validates_every_stage():
    cfg = load_config("examples/agent.yaml", model=PipelineConfig)
    pipe = Pipeline(cfg)
    sft = pipe.sft_config("x", Path("d.jsonl"))
    assert pipe.rl_config("x").rollout.require_submit and sft.data.packing and sft.data.pack_length == 2048


@pytest.mark.slow  # ~15 s: every stage of a pipeline runs; the stages' own tests run fast
def test_a_plugin_workspace_family_goes_through_the_pipeline(tmp_path, monkeypatch):
    """A user's multi-turn family (`package.module:Name`, the same tools) gets demonstrations from
    its oracle, SFT and the evaluation like the built-ins; its stages' child processes import it too."""

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "plugins"))
    cfg = _cfg(tmp_path, "name=plugin", "families=[wordtasks:CountLines]", "heldout_subfamilies=[]", "stages=[sft]",
               "demos.tasks=3", "eval.tasks=2")
    summary = run_pipeline(cfg)
    run = tmp_path / "plugin"
    rows = [json.loads(x) for x in (run / "demos.jsonl").read_text().splitlines()]
    assert rows and {r["family"] for r in rows} == {"countlines"} and all(r["messages"][-1]["role"] != "system" for r in rows)
    assert list(summary["stages"]) == ["base", "sft"] and summary["stages"]["sft"]["n"] == 2
    assert json.loads((run / "eval_sft.json").read_text())["wordtasks:CountLines"]["task_ids"][0].startswith("countlines/")


def test_a_stage_process_ends_when_the_pipeline_is_killed():
    import os
    import signal
    import subprocess
    import sys

    from tests.waiting import wait_until

    parent = subprocess.Popen([sys.executable, "-c", "import time\nfrom longhaul.runtime.pipeline import _isolated\n_isolated(time.sleep, 600)"])

    def stage():  # the pool's worker: a spawned child of the pipeline that is not the resource tracker
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except (OSError, IndexError):
                continue
            if ppid == parent.pid and b"spawn_main" in cmd and b"resource_tracker" not in cmd:
                return int(pid)
        return None

    try:
        pid = wait_until(stage, what="the stage process")
        parent.send_signal(signal.SIGKILL)
        parent.wait()

        def gone() -> bool:
            try:
                return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                return True

        wait_until(gone, what="the orphaned stage process to end")
    finally:
        parent.kill()
