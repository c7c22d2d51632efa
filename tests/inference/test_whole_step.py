"""The engine's whole native decode step (`LLMEngine._run_whole`): taken for batches of one new
token a sequence whose sampling needs only the temperature, with outputs equal to the general
path's; and the detokenizer it records text with."""

import copy

import pytest

from longhaul.inference import LLMEngine, SamplingParams
from longhaul.inference.sequence import detokenizer
from longhaul.models import load_policy


def _outputs(engine, prompts, params, flush=True):
    if flush:
        engine.flush_prefix_cache()
    return [(o.token_ids, o.logprobs, o.text, o.finish_reason) for o in engine.generate(prompts, params)]


@pytest.fixture
def engine():
    model, tok = load_policy("tiny-llama")
    return LLMEngine(model, dtype="bfloat16", tokenizer=tok, adaptive_threads=False, num_kv_blocks=64, block_size=4)


def _counting(engine, monkeypatch):
    taken, run = [], engine.runner.decode_sample
    monkeypatch.setattr(engine.runner, "decode_sample", lambda *a: taken.append(run(*a)) or taken[-1])
    return taken


@pytest.mark.parametrize("case", ["plain", "greedy", "top_k", "min_tokens", "logprobs", "raw"])
def test_whole_step_only_where_sampling_allows_with_equal_outputs(native, engine, monkeypatch, case):
    extra = {"plain": {}, "greedy": {"temperature": 0.0}, "top_k": {"top_k": 5}, "min_tokens": {"min_tokens": 6},
             "logprobs": {"logprobs": 2}, "raw": {"logprobs_mode": "raw"}}[case]
    # the first sequence runs to its end (with min_tokens, EOS is only banned where it would stop it)
    first = {"temperature": 1.0, "max_tokens": 10, "seed": 3, "ignore_eos": case != "min_tokens"} | extra
    params = [SamplingParams(**first), SamplingParams(temperature=0.0, max_tokens=8),
              SamplingParams(temperature=0.8 if case != "greedy" else 0.0, max_tokens=10, seed=4)]
    tok = engine.tokenizer
    prompts = [tok.encode("the cat"), tok.encode("a dog and"), tok.encode("x")]
    taken = _counting(engine, monkeypatch)
    whole = _outputs(engine, prompts, params)
    monkeypatch.setattr(engine, "_run_whole", lambda batch: None)
    assert whole == _outputs(engine, prompts, params)
    if case in ("plain", "greedy"):
        assert len(taken) >= 9 and all(t is not None for t in taken)
    elif case == "min_tokens":  # EOS is banned for the first six tokens, then the step is whole again
        assert taken and len(taken) < 9
    else:
        assert not taken


def test_a_cached_prompt_whose_last_token_alone_is_new(native, engine, monkeypatch):
    """A prompt of 9 tokens over blocks of 4: a second run finds 8 in the prefix cache, so its first
    step is one new token, which the whole step takes like a decode."""
    prompt = engine.tokenizer.encode("the cat sat on the mat and then")[:9]
    assert len(prompt) == 9
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=2, ignore_eos=True)]
    _outputs(engine, [prompt], params)
    taken = _counting(engine, monkeypatch)
    whole = _outputs(engine, [prompt], params, flush=False)
    assert len(taken) == 6 and all(t is not None for t in taken)  # the prompt's last token, then five decodes
    monkeypatch.setattr(engine, "_run_whole", lambda batch: None)
    assert whole == _outputs(engine, [prompt], params, flush=False)


def test_a_nan_temperature_is_refused():
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=float("nan"))


def test_detokenizer_calls_the_rust_tokenizer_where_hf_only_passes_on(monkeypatch):
    _, tok = load_policy("tiny-llama")
    assert tok.clean_up_tokenization_spaces is False and detokenizer(tok) is tok._tokenizer
    ids = tok.encode("héllo wörld, the cat  sat") + [tok.eos_token_id]
    for skip in (True, False):
        assert detokenizer(tok).decode(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)
    monkeypatch.setattr(tok, "clean_up_tokenization_spaces", True)
    assert detokenizer(tok) is tok
    monkeypatch.setattr(tok, "clean_up_tokenization_spaces", False)
    own = copy.copy(tok)
    own.__class__ = type("OwnDecode", (type(tok),), {"_decode": lambda self, ids, **kw: "overridden"})
    assert detokenizer(own) is own  # a tokenizer with its own decode keeps it
    assert detokenizer(None) is None
