"""`longhaul generate` and `longhaul bench engine` through the real command, on a tiny model."""

import json

import pytest

from tests.cli_main import run_main as run_cli


def test_generate_prints_json_lines(tmp_path):
    r = run_cli("generate", "--model", "tiny-llama", "--prompt", "hi", "--prompt", "def f", "--max-tokens", "5", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["prompt"] for row in rows] == ["hi", "def f"]
    assert all(len(row["token_ids"]) == len(row["logprobs"]) == len(row["weight_version"]) <= 5 for row in rows)


def test_generate_without_prompts_is_one_error_line(tmp_path):
    r = run_cli("generate", "--model", "tiny-llama", cwd=tmp_path)
    assert r.returncode != 0 and r.stderr.strip().startswith("error: no prompts") and "Traceback" not in r.stderr


@pytest.mark.slow  # ~11 s: benchmark runs in subprocesses
def test_bench_engine_writes_merged_results(tmp_path):
    args = ("bench", "engine", "--model", "tiny-llama", "--batch-sizes", "1,2", "--max-tokens", "4", "--repeats", "1")
    r = run_cli(*args, "--dtype", "float32", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(row["batch_size"], row["engine_tokens"], row["hf_tokens"]) for row in out["rows"]] == [(1, 4, 4), (2, 8, 8)]
    assert "bench engine:" in r.stderr  # progress goes to stderr
    r = run_cli(*args, "--dtype", "bfloat16", cwd=tmp_path)
    assert r.returncode == 0 and "vs HF" in r.stdout
    saved = json.loads((tmp_path / "benchmarks" / "results" / "engine.json").read_text())
    assert sorted((row["dtype"], row["batch_size"]) for row in saved["rows"]) == [("bfloat16", 1), ("bfloat16", 2), ("float32", 1), ("float32", 2)]


@pytest.mark.slow  # ~12 s: two CLI runs; the speculative engine's greedy equality is tested in-process (tests/inference)
def test_generate_decodes_speculatively_with_the_same_greedy_tokens(tmp_path):
    args = ("generate", "--model", "tiny-llama", "--prompt", "ab ab ab ab ab", "--max-tokens", "12", "--raw", "--json")
    plain = run_cli(*args, cwd=tmp_path)
    spec = run_cli(*args, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}', cwd=tmp_path)
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert json.loads(spec.stdout)["token_ids"] == json.loads(plain.stdout)["token_ids"]


def test_a_bad_speculative_config_is_one_error_line(tmp_path):
    from longhaul.cli import _speculative_config
    from longhaul.errors import LonghaulError

    for value, words in (("{method: ngram", "is not JSON"), ('["ngram"]', "must be a JSON object")):
        with pytest.raises(LonghaulError, match=words):
            _speculative_config(value)
    # the whole CLI once: one line, no traceback, a non-zero exit
    r = run_cli("generate", "--model", "tiny-llama", "--prompt", "hi", "--speculative-config", '{"method": "medusa"}', cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--speculative-config: method" in r.stderr, r.stderr


@pytest.mark.slow  # a CLI process that loads and quantizes a model (~5 s); the engine's q4_0 path is tested in process
def test_generate_runs_quantized_weights(tmp_path):
    r = run_cli("generate", "--model", "tiny-llama", "--prompt", "hi", "--max-tokens", "4", "--json", "--quantization", "q4_0",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert 0 < len(json.loads(r.stdout)["token_ids"]) <= 4


def test_generate_names_a_bad_quantization_format(tmp_path):
    r = run_cli("generate", "--model", "tiny-llama", "--prompt", "hi", "--quantization", "q5", cwd=tmp_path)
    assert r.returncode != 0 and r.stderr.strip() == "error: --quantization must be int8, q8_0, q4_0, q4_1 or gguf, got 'q5'"
