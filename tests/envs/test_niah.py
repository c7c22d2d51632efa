"""The `niah` long-context family: haystacks of the asked length with the needle at its depth,
deterministic per seed; the scorer passes the reference and refuses the null reply, wrong numbers
and wrong variable sets; `longhaul eval --suite niah` runs end to end and reports by length."""

import json
import re

import pytest

from longhaul.envs import niah
from longhaul.envs.registry import get_family
from tests.test_cli import run_cli


@pytest.mark.parametrize("sub", niah.SUBFAMILIES)
def test_each_subfamily_has_its_length_and_needle(sub):
    task = niah.make_split("heldout", 1, subfamilies=[sub])[0]
    size = int(sub.rpartition("_")[2][:-1]) * 1024
    assert task.subfamily == sub and task.length_tokens == size
    tokens = len(task.prompt) / niah.CHARS_PER_TOKEN[task.subfamily.rpartition("_")[0]]
    assert 0.8 * size < tokens < size - 48  # fills most of the window, leaving room for the answer
    if not sub.startswith("vartrack"):  # the answer's first mention sits at its depth (intro and question aside)
        assert abs(task.prompt.find(task.answer[0]) / len(task.prompt) - task.depth) < 0.15
    else:  # the chain's head holds the value, at the shallowest of its depths
        head = task.prompt.find(f"VAR {task.answer[0]} = ")
        assert head >= 0 and head / len(task.prompt) <= task.depth + 0.15
    assert niah.make_task(task.seed, sub) == task  # a pure function of the seed


@pytest.mark.parametrize("kind", niah.KINDS)
def test_scoring_passes_the_answer_only(kind):
    fam = get_family("niah")
    tasks = niah.make_split("heldout", 4, subfamilies=[f"{kind}_1k"])
    good = fam.score_many(tasks, [fam.reference_reply(t) for t in tasks])
    bad = fam.score_many(tasks, [fam.null_reply(t) for t in tasks])
    assert all(s.passed for s in good) and not any(s.passed for s in bad)
    t = tasks[0]
    if kind == "vartrack":
        assert not niah.passed(t, ", ".join(t.answer[:-1]))  # one variable missing
        assert not niah.passed(t, ", ".join(t.answer) + ", ZZ")  # one too many
        assert niah.passed(t, "They are " + " and ".join(reversed(t.answer)))  # any order, any words around
    else:
        assert not niah.passed(t, "12345" if t.answer[0] != "12345" else "54321")
        assert niah.passed(t, f"The number is {t.answer[0]}.")
        if kind == "multikey":  # the distractors are in the text, and are not the answer
            others = [n for n in set(re.findall(r"is: (\d{5})", t.prompt)) if n != t.answer[0]]
            assert len(others) == 3 and not niah.passed(t, others[0])


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="evaluation only"):
        niah.make_split("train", 2)
    with pytest.raises(ValueError, match="unknown sub-family 'passkey_3k'"):
        niah.make_split("heldout", 2, subfamilies=["passkey_3k"])


def test_longhaul_eval_runs_the_suite_and_reports_by_length(tmp_path):
    # tiny-llama reads bytes: a "1k" haystack is ~4,600 tokens, so the context is raised to hold it
    r = run_cli("eval", "--model", "tiny-llama", "--suite", "niah", "--subfamilies", "passkey_1k,single_1k", "--n", "2",
                "--max-new-tokens", "6", "--context-length", "6144", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] == 2 and set(out["by_subfamily"]) == {"passkey_1k", "single_1k"}
