"""Bad input through the real `longhaul` command: one error line, non-zero exit, no traceback,
nothing written under runs/. The command runs in this process (tests.cli_main), but for the
traceback --debug shows, which goes through a real `python -m longhaul.cli`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.cli_main import run_main as run_cli

ROOT = Path(__file__).resolve().parents[1]


def _assert_clean_error(r, pattern, cwd):
    assert r.returncode != 0
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    assert not (Path(cwd) / "runs").exists() or not any((Path(cwd) / "runs").iterdir())


@pytest.mark.parametrize("override, pattern", [
    ("train.stpes=3", "did you mean train.steps"),
    ("model.name=/no/such/model", "neither a built-in"),
    ("model.context_length=32", "over the model context of 32"),
    ("train.device=tpu", "auto, cpu, cuda or cuda:N"),
    pytest.param("rollout.device=cuda", "use device cpu, or auto",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")),
    pytest.param("train.device=cuda:7", "use device cpu, or auto",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")),
])
def test_bad_train_input(tmp_path, override, pattern):
    r = run_cli("train", str(ROOT / "examples/tiny_grpo.yaml"), override, cwd=tmp_path)
    _assert_clean_error(r, pattern, tmp_path)


def test_corrupt_model_file(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    r = run_cli("train", str(ROOT / "examples/tiny_grpo.yaml"), f"model.name={bad}", cwd=tmp_path)
    _assert_clean_error(r, "could not read GGUF", tmp_path)


def test_debug_shows_the_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "longhaul.cli", "train", str(ROOT / "examples/tiny_grpo.yaml"), "train.stpes=3",
                        "--debug"], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                       timeout=300)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_a_usage_error_gets_the_usage_and_exit_2(tmp_path):
    for args, pattern in ((["generate", "hi"], "unexpected extra argument"), (["generate", "--bogus", "1"], "No such option")):
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and pattern in r.stderr and "Usage: longhaul generate" in r.stderr, r.stderr
        assert "unexpected UsageError" not in r.stderr and "Traceback" not in r.stderr
    assert run_cli("--help", cwd=tmp_path).returncode == 0


def test_env_prints_versions(tmp_path):
    r = run_cli("env", cwd=tmp_path)
    assert r.returncode == 0
    for key in ("python:", "torch:", "transformers:", "bubblewrap:", "cpu:", "gpu:"):
        assert key in r.stdout


def test_eval_json_prints_one_object(tmp_path):
    import json

    r = run_cli("eval", "--model", "tiny-llama", "--suite", "echo", "--n", "4", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["n"] == 4 and 0 <= res["pass_rate"] <= 1 and len(res["ci95"]) == 2


@pytest.mark.slow  # ~12 s: two eval processes; the pass@k estimator is tested in-process (tests/eval)
def test_eval_samples_reports_pass_at_k(tmp_path):
    import json

    r = run_cli("eval", "--model", "tiny-llama", "--suite", "echo", "--n", "3", "--samples", "4", "--max-new-tokens", "8", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["samples"] == 4 and {"pass@1", "pass@4", "pass@1_ci95", "no_compile_rate", "limit_rate"} <= set(res)
    assert 0 <= res["pass@1"] <= res["pass@4"] <= 1
    r = run_cli("eval", "--model", "tiny-llama", "--suite", "echo", "--samples", "0", cwd=tmp_path)
    assert r.returncode == 2 and "--samples must be >= 1" in r.stderr


@pytest.mark.parametrize("args, pattern", [
    (["envcheck", "nope"], "unknown task family 'nope'"),
    (["envcheck", "echo", "--runs", "1"], "at least 2 runs"),
    (["envcheck", "echo", "--n", "0"], "--n must be >= 1"),
    (["envcheck", "no_such_mod:Fam"], "cannot import module"),
    (["train", str(ROOT / "examples/tiny_grpo.yaml"), "task.family=bugfix"], "has not been validated"),
])
def test_bad_envcheck_and_family_input(tmp_path, args, pattern):
    _assert_clean_error(run_cli(*args, cwd=tmp_path), pattern, tmp_path)


def test_envcheck_json_names_families_tasks_valid_flaky_failing(tmp_path, monkeypatch, capsys):
    import json

    from longhaul.cli import main

    monkeypatch.setenv("LONGHAUL_HOME", str(tmp_path / "home"))

    def envcheck(*args) -> dict:  # in this process: the command's own code, without a second interpreter's start-up
        try:
            main(["envcheck", "echo", "--json", *args])
        except SystemExit as e:
            assert e.code in (0, None), capsys.readouterr().err
        return json.loads(capsys.readouterr().out)

    out = envcheck("--n", "4")
    assert {"families", "tasks", "valid", "flaky", "failing"} <= set(out)
    assert out["families"]["echo"]["status"] == "ok" and out["flaky"] == out["failing"] == []
    assert (tmp_path / "home" / "envcheck" / "manifest.json").exists()
    mine = tmp_path / "mine" / "manifest.json"  # --manifest writes elsewhere and leaves the shared one alone
    before = (tmp_path / "home" / "envcheck" / "manifest.json").read_text()
    assert envcheck("--n", "2", "--manifest", str(mine))["manifest"] == str(mine)
    assert "echo" in json.loads(mine.read_text())["families"]
    assert (tmp_path / "home" / "envcheck" / "manifest.json").read_text() == before


_LONG_EVAL = ("eval", "--model", "tiny-llama", "--suite", "terminal", "--n", "3", "--max-turns", "1", "--max-new-tokens", "2040", "--json")


def test_eval_refuses_a_budget_past_the_context(tmp_path):
    r = run_cli(*_LONG_EVAL, cwd=tmp_path)  # a terminal prompt and 2,040 new tokens do not fit tiny-llama's own 2,048 positions
    _assert_clean_error(r, "--context-length", tmp_path)


@pytest.mark.slow  # a second CLI process (~5 s); sub-family lists are refused in process by the pipeline's tests
def test_eval_refuses_an_unknown_subfamily(tmp_path):
    r = run_cli(*_LONG_EVAL, "--subfamilies", "nope", "--context-length", "8192", cwd=tmp_path)
    _assert_clean_error(r, "sub-family list ['nope']; valid:", tmp_path)


def test_eval_refuses_a_bad_rope_extension(tmp_path):
    r = run_cli("eval", "--model", "tiny-llama", "--suite", "echo", "--rope-scaling", '{"rope_type": "ntk", "factor": 2}', cwd=tmp_path)
    _assert_clean_error(r, "is not one of linear, dynamic, yarn, llama3", tmp_path)


@pytest.mark.slow  # two more CLI processes (~9 s)
def test_eval_takes_a_rope_extension_and_refuses_one_that_is_not_json(tmp_path):
    import json

    r = run_cli("eval", "--model", "tiny-llama", "--suite", "echo", "--n", "2", "--max-new-tokens", "8", "--json",
                "--rope-scaling", '{"rope_type": "yarn", "factor": 2}', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n"] == 2
    r = run_cli("eval", "--model", "tiny-llama", "--suite", "echo", "--rope-scaling", '{"rope_type": "yarn"', cwd=tmp_path)
    _assert_clean_error(r, "--rope-scaling is not JSON", tmp_path)


@pytest.mark.slow
def test_eval_draws_from_named_subfamilies_with_a_longer_context(tmp_path):
    import json

    args = _LONG_EVAL
    r = run_cli(*args, "--subfamilies", "sed_replace,fix_perms", "--context-length", "8192", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["n"] == 3 and set(res["by_subfamily"]) <= {"sed_replace", "fix_perms"}
    assert sum(g["n"] for g in res["by_subfamily"].values()) == 3
