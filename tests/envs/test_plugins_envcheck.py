"""User families, envs and reward functions from package.module:Name, envcheck and its manifest,
and training's refusal of unchecked, stale or failing families."""

import json
from pathlib import Path

import pytest

from longhaul.config import RunConfig
from longhaul.envs.registry import get_family, reward_family
from longhaul.errors import LonghaulError
from longhaul.eval.envcheck import load_manifest, require_checked, run_envcheck
from longhaul.runtime.setup import prepare

PLUGINS = Path(__file__).resolve().parents[2] / "examples" / "plugins"


@pytest.fixture(autouse=True)
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


@pytest.mark.parametrize("spec, fragment", [
    ("wordtasks", "not a task family"),  # no colon: an unknown built-in name
    ("no_such_module_xyz:Fam", "cannot import module"),
    ("wordtasks:Nope", "has no 'Nope'"),
    ("wordtasks:WORDS", "lacks FAMILY, VERSION, make_split"),
    ("wordtasks:length_reward", "lacks FAMILY"),
])
def test_bad_family_specs_name_the_problem(spec, fragment):
    with pytest.raises(LonghaulError) as e:
        get_family(spec)
    msg = str(e.value)
    assert fragment in msg or ("unknown task family" in msg and fragment == "not a task family")


def test_a_user_single_turn_family_with_a_reward_function():
    fam = get_family("wordtasks:Reverse")
    assert (fam.name, fam.kind, fam.difficulties) == ("reverse", "answer", (1, 2))
    tasks = fam.make_split("train", 3)
    rewarded = reward_family(fam, "wordtasks:length_reward")
    scores = rewarded.score_many(tasks, [tasks[0].answer, tasks[1].answer[:3] + "zzz", "nope"])
    assert scores[0].passed and scores[0].reward == 1.0
    assert not scores[1].passed and scores[1].reward == pytest.approx(3 / len(tasks[1].answer) * 0.5)
    with pytest.raises(LonghaulError, match="is not callable"):
        reward_family(fam, "wordtasks:WORDS")
    with pytest.raises(LonghaulError, match="multi-turn"):
        reward_family(get_family("wordtasks:CountLines"), "wordtasks:length_reward")


def test_envcheck_validates_user_families_and_writes_the_manifest(tmp_path):
    man = tmp_path / "manifest.json"
    res = run_envcheck(["wordtasks:Reverse", "wordtasks:CountLines"], n=4, manifest=man)
    assert set(res) >= {"families", "tasks", "valid", "flaky", "failing"}
    rev, cl = res["families"]["reverse"], res["families"]["countlines"]
    assert rev["status"] == cl["status"] == "ok" and res["flaky"] == [] and res["failing"] == []
    assert rev["checked"] == 2 * 2 * 2  # 2 splits x 2 difficulties x ceil(4 / 2)
    assert cl["valid"] == cl["checked"] == 8 and cl["subfamilies"] == {"countlines/count": 8}
    saved = load_manifest(man)["families"]
    assert saved["reverse"]["content_hash"] == get_family("wordtasks:Reverse").content_hash()
    assert require_checked(get_family("wordtasks:Reverse"), man) == set()


def test_humaneval_canonical_solutions_pass_and_empty_bodies_fail(tmp_path):
    res = run_envcheck(["humaneval"], n=1, manifest=tmp_path / "m.json")  # a fixed set: all 164 whatever --n says
    he = res["families"]["humaneval"]
    assert (he["checked"], he["valid"], he["failing"]) == (164, 164, [])


def test_a_family_whose_reference_fails_is_failing_and_excluded(tmp_path, monkeypatch):
    import wordtasks

    monkeypatch.setattr(wordtasks.Reverse, "reference_reply", staticmethod(lambda t: t.answer if t.seed % 2 else "wrong"))
    res = run_envcheck(["wordtasks:Reverse"], n=4, manifest=tmp_path / "m.json")
    e = res["families"]["reverse"]
    assert e["status"] == "failing" and len(e["failing"]) == 4
    assert all("does not pass" in e["reasons"][t] for t in e["failing"])
    # the same tasks by split, then sub-family: where a problem is, without reading task ids
    by_split = e["problems"]
    assert set(by_split) <= {"train", "heldout"} and res["problems"] == {"reverse": by_split}
    listed = [t for subs in by_split.values() for sub in subs.values() for t in sub["failing"] + sub["flaky"]]
    assert sorted(listed) == sorted(e["failing"]) and all(set(subs) == {"reverse/reverse"} for subs in by_split.values())


def _cfg(family, **task):
    return RunConfig.model_validate({"model": {"name": "tiny-llama"}, "task": {"family": family, **task},
                                     "train": {"steps": 1}, "rollout": {"prompts_per_step": 2, "group_size": 2},
                                     "eval": {"n_tasks": 2}, "log": {"progress": False}})


def test_training_refuses_missing_stale_and_failing_manifests(tmp_path, monkeypatch):
    man = tmp_path / "m.json"
    monkeypatch.setattr("longhaul.eval.envcheck.manifest_path", lambda: man)
    with pytest.raises(LonghaulError, match="has not been validated.*longhaul envcheck reverse"):
        prepare(_cfg("wordtasks:Reverse"))
    run_envcheck(["wordtasks:Reverse"], n=2, manifest=man)
    prep = prepare(_cfg("wordtasks:Reverse", reward="wordtasks:length_reward"))
    assert len(prep.train_tasks) == 2 and prep.family.name == "reverse"
    data = json.loads(man.read_text())
    data["families"]["reverse"]["content_hash"] = "0" * 16
    man.write_text(json.dumps(data))
    with pytest.raises(LonghaulError, match="stale"):
        prepare(_cfg("wordtasks:Reverse"))
    data["families"]["reverse"]["content_hash"] = get_family("wordtasks:Reverse").content_hash()
    data["families"]["reverse"]["status"] = "failing"
    man.write_text(json.dumps(data))
    with pytest.raises(LonghaulError, match="failed envcheck"):
        prepare(_cfg("wordtasks:Reverse"))
    with pytest.raises(LonghaulError, match="has not been validated"):
        prepare(_cfg("wordtasks:CountLines"))
    man.write_text("{not json")
    with pytest.raises(LonghaulError, match="corrupt"):
        prepare(_cfg("wordtasks:Reverse"))


def test_training_skips_tasks_envcheck_excluded(tmp_path, monkeypatch):
    man = tmp_path / "m.json"
    monkeypatch.setattr("longhaul.eval.envcheck.manifest_path", lambda: man)
    run_envcheck(["wordtasks:Reverse"], n=2, manifest=man)
    data = json.loads(man.read_text())
    bad = get_family("wordtasks:Reverse").make_split("train", 1)[0].task_id
    data["families"]["reverse"]["flaky"] = [bad]
    man.write_text(json.dumps(data))
    prep = prepare(_cfg("wordtasks:Reverse"))
    assert bad not in [t.task_id for t in prep.train_tasks] and len(prep.train_tasks) == 2
