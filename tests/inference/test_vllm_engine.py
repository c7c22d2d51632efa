"""vLLM as the rollout engine, for real (its CPU build in `.venv-vllm`, `make vllm`): greedy
rollouts of SmolLM2 equal longhaul's engine token for token with behaviour log-probs within a
stated tolerance, a known weight update shows in the next rollout on both engines alike, and a
missing or too old vLLM is refused in one line."""

import os
import sys
from pathlib import Path

import pytest
import torch

from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine, RolloutParams, generate
from longhaul.inference.vllm_engine import VLLMEngine

VLLM = os.environ.get("LONGHAUL_VLLM_PYTHON", "")
needs_vllm = pytest.mark.skipif(not os.access(VLLM, os.X_OK), reason="no vLLM environment (`make vllm`, LONGHAUL_VLLM_PYTHON)")
LOGPROB_ATOL = 2e-3  # fp32 on both sides; the kernels (vLLM's CPU attention and GEMMs, ours) round differently
TEXTS = ["def add(a, b):", "The capital of France is", "Write a haiku about the sea.", "1, 1, 2, 3, 5, 8,"]


@pytest.fixture(scope="module")
def smollm2():
    home = Path(os.environ.get("LONGHAUL_REAL_HOME", Path.home() / ".cache" / "longhaul"))
    test_home = os.environ.get("LONGHAUL_HOME")
    if (home / "models" / "smollm2-135m-instruct" / "config.json").is_file():  # reuse the user's prepared model
        os.environ["LONGHAUL_HOME"] = str(home)
    from longhaul.models import load_policy, prepare_builtin

    try:
        path = prepare_builtin("smollm2-135m-instruct", log=lambda s: None)
        model, tok = load_policy("smollm2-135m-instruct")
    finally:
        if test_home is None:
            os.environ.pop("LONGHAUL_HOME", None)
        else:
            os.environ["LONGHAUL_HOME"] = test_home
    return Path(path), model.eval(), tok


@pytest.fixture(scope="module")
def engines(smollm2):
    path, model, tok = smollm2
    ours = LLMEngine(model, tokenizer=tok, dtype="float32", max_model_len=1024)
    theirs = VLLMEngine(path, dtype="float32", max_model_len=1024, python=VLLM)
    yield ours, theirs, tok
    theirs.close()


def greedy_both(ours, theirs, prompts, n=24):
    params = RolloutParams(max_new_tokens=n, temperature=0.0)
    return generate(ours, None, prompts, params), generate(theirs, None, prompts, params)


@needs_vllm
def test_greedy_rollouts_equal_longhauls_engine(engines):
    ours, theirs, tok = engines
    prompts = [tok.encode(t) for t in TEXTS]
    a, b = greedy_both(ours, theirs, prompts)
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < LOGPROB_ATOL
        assert y.versions == [0] * len(y.token_ids) and y.finish_reason == x.finish_reason
    sampled = generate(theirs, None, prompts[:2], RolloutParams(max_new_tokens=8, temperature=1.0), seeds=[7, 8])
    again = generate(theirs, None, prompts[:2], RolloutParams(max_new_tokens=8, temperature=1.0), seeds=[7, 8])
    assert [s.token_ids for s in sampled] == [s.token_ids for s in again]  # a seed makes a draw reproducible
    stop = RolloutParams(max_new_tokens=48, temperature=0.0, stop=("\n",))
    mine, stopped = generate(ours, tok, [prompts[0]], stop)[0], generate(theirs, tok, [prompts[0]], stop)[0]
    assert "\n" in tok.decode(stopped.token_ids) and stopped.finish_reason == "stop" == mine.finish_reason
    assert stopped.token_ids == mine.token_ids  # the token holding the stop string is kept, as ours keeps it


@needs_vllm
def test_a_weight_update_shows_in_the_next_rollout(engines, smollm2):
    ours, theirs, tok = engines
    _, model, _ = smollm2
    prompts = [tok.encode(t) for t in TEXTS[:2]]
    before, _ = greedy_both(ours, theirs, prompts, 12)
    gen = torch.Generator().manual_seed(0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for k in [k for k in state if ".mlp.down_proj." in k][:10]:  # a known change: ten layers' MLP outputs perturbed
        state[k] += torch.randn(state[k].shape, generator=gen) * 0.05
    ours.update_weights(state, 3)
    theirs.update_weights(state, 3)
    a, b = greedy_both(ours, theirs, prompts, 12)
    assert [x.token_ids for x in a] != [x.token_ids for x in before]  # the update changed what the model says
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids and max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < LOGPROB_ATOL
        assert y.versions == [3] * len(y.token_ids)
    ours.update_weights(model.state_dict(), 4)
    theirs.update_weights(model.state_dict(), 4)
    assert [x.token_ids for x in greedy_both(ours, theirs, prompts, 12)[1]] == [x.token_ids for x in before]


def test_without_vllm_the_sampler_is_refused_in_one_line(smollm2, tmp_path, monkeypatch):
    path = smollm2[0]
    monkeypatch.setenv("LONGHAUL_VLLM_PYTHON", str(tmp_path / "nothing"))
    with pytest.raises(LonghaulError, match="is not an executable; point it at the python of an environment with vLLM"):
        VLLMEngine(path)
    with pytest.raises(LonghaulError, match="the vLLM worker exited .*No module named 'vllm'"):
        VLLMEngine(path, python=sys.executable)  # this environment has no vLLM


def test_a_vllm_without_the_hooks_is_named(smollm2, tmp_path, monkeypatch):
    fake = tmp_path / "vllm"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "0.4.2"\nclass LLM:\n    pass\nclass SamplingParams:\n    pass\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(LonghaulError, match=r"vLLM 0\.4\.2 lacks LLM\.apply_model, LLM\.reset_prefix_cache"):
        VLLMEngine(smollm2[0], python=sys.executable)
