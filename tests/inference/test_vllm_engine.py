"""vLLM as the rollout engine, for real (its CPU build in `.venv-vllm`, `make vllm`): greedy
rollouts of SmolLM2 equal longhaul's engine token for token with behaviour log-probs within a
stated tolerance, calls from many threads share the worker's batch, a known weight update shows
in the next rollout on both engines alike and lands in the middle of rollouts in flight (partial
rollouts: each token stamped with its version, the rest decoded under the new weights), and a
missing or too old vLLM is refused in one line."""

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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


def update_both(ours, theirs, state, version):
    ours.update_weights(state, version)
    theirs.update_weights(state, version)


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
    state = _perturbed(model)
    update_both(ours, theirs, state, 3)
    a, b = greedy_both(ours, theirs, prompts, 12)
    assert [x.token_ids for x in a] != [x.token_ids for x in before]  # the update changed what the model says
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids and max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < LOGPROB_ATOL
        assert y.versions == [3] * len(y.token_ids)
    update_both(ours, theirs, model.state_dict(), 4)
    assert [x.token_ids for x in greedy_both(ours, theirs, prompts, 12)[1]] == [x.token_ids for x in before]


@needs_vllm
def test_calls_from_many_threads_share_the_batch(engines):
    ours, theirs, tok = engines
    prompts = [tok.encode(t) for t in TEXTS]
    params = RolloutParams(max_new_tokens=16, temperature=0.0)
    alone = generate(ours, None, prompts, params)
    with ThreadPoolExecutor(len(prompts)) as pool:  # one call a thread, all in flight at once
        apart = list(pool.map(lambda p: generate(theirs, None, [p], params)[0], prompts))
    assert [c.token_ids for c in apart] == [c.token_ids for c in alone]


def _perturbed(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for k in [k for k in state if ".mlp.down_proj." in k][:10]:  # a known change: ten layers' MLP outputs perturbed
        state[k] += torch.randn(state[k].shape, generator=gen) * 0.05
    return state


@needs_vllm
def test_a_weight_update_lands_in_rollouts_in_flight(engines, smollm2):
    """Long greedy rollouts, and a weight update sent while they run: each completion's tokens
    carry the old version up to the update and the new one after it, and what follows the switch
    is what the new weights say greedily after the prompt and the tokens before it (the worker
    re-prefilled)."""
    ours, theirs, tok = engines
    _, model, _ = smollm2
    prompts = [tok.encode(t) for t in ("Once upon a time, in a land far away,", "Here is a long list of fruits: apple,")]
    params = RolloutParams(max_new_tokens=160, temperature=0.0)
    new, old, v = _perturbed(model), theirs.weight_version, theirs.weight_version + 1
    done = []
    rollouts = threading.Thread(target=lambda: done.append(generate(theirs, None, prompts, params)))
    rollouts.start()
    time.sleep(2.0)  # ~50 of the 160 tokens on 2 cores
    assert rollouts.is_alive()
    theirs.update_weights(new, v)
    rollouts.join()
    ours.update_weights(new, v)
    try:
        switched = 0
        for prompt, c in zip(prompts, done[0]):
            j = c.versions.index(v) if v in c.versions else len(c.versions)
            assert c.versions == [old] * j + [v] * (len(c.versions) - j)
            if 0 < j < len(c.token_ids):
                switched += 1
                after = generate(ours, None, [prompt + c.token_ids[:j]], RolloutParams(max_new_tokens=len(c.token_ids) - j, temperature=0.0))
                assert after[0].token_ids == c.token_ids[j:][:len(after[0].token_ids)]
        assert switched, "the update landed before or after the rollouts; no completion switched versions"
    finally:
        update_both(ours, theirs, model.state_dict(), v + 1)


@needs_vllm
def test_a_paused_engine_holds_its_rollouts_until_resumed(engines, smollm2):
    """Paused, a call waits (8 tokens take well under the second waited); a weight update made
    meanwhile reaches every token; resumed, the call ends with what the new weights say."""
    ours, theirs, tok = engines
    _, model, _ = smollm2
    prompts = [tok.encode(TEXTS[1])]
    params = RolloutParams(max_new_tokens=8, temperature=0.0)
    v = theirs.weight_version + 1
    theirs.pause()
    done = []
    rollout = threading.Thread(target=lambda: done.append(generate(theirs, None, prompts, params)[0]))
    rollout.start()
    try:
        time.sleep(1.0)
        assert rollout.is_alive() and not done
        update_both(ours, theirs, _perturbed(model, seed=1), v)
    finally:
        theirs.resume()
        rollout.join()
    try:
        assert done[0].versions == [v] * len(done[0].token_ids)
        assert done[0].token_ids == generate(ours, None, prompts, params)[0].token_ids
    finally:
        update_both(ours, theirs, model.state_dict(), v + 1)


@needs_vllm
def test_a_refused_call_fails_alone(engines):
    """A prompt past the context fails its own call with vLLM's reason; the others, before and
    after, are served."""
    ours, theirs, tok = engines
    params = RolloutParams(max_new_tokens=4, temperature=0.0)
    with ThreadPoolExecutor(2) as pool:
        ok = pool.submit(generate, theirs, None, [tok.encode(TEXTS[0])], params)
        with pytest.raises(LonghaulError, match="vLLM: .*1024"):
            generate(theirs, None, [[1] * 1100], params)
        assert len(ok.result()[0].token_ids) == 4
    assert generate(theirs, None, [tok.encode(TEXTS[1])], params)[0].token_ids == generate(ours, None, [tok.encode(TEXTS[1])], params)[0].token_ids


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
