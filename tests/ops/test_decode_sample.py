"""`DecodeLayers.sample` (csrc/decode_step.cpp) and the engine's whole native step: from token ids
to sampled tokens in one call, bit for bit what the runner's forward and then `sampling.sample`
give, in every weight format with a native kernel; the engine takes it only for batches whose
sampling needs nothing but the temperature."""

import pytest
import torch

from longhaul.inference import LLMEngine, SamplingParams
from longhaul.inference.model_runner import BatchItem
from longhaul.inference.sampling import sample
from longhaul.inference.sequence import detokenizer
from longhaul.models import load_policy

PROMPTS = [[5, 9, 2, 7, 1], [4, 4, 8], [3, 6]]
TABLES = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # blocks of 4: room for 12 positions each


def _runner(model, dtype, quant):
    return LLMEngine(model, dtype=dtype, quantization=quant, adaptive_threads=False, num_kv_blocks=12, block_size=4).runner


def whole_equals_general(name, dtype, quant, temps=(1.0, 0.7, 0.0), steps=4):
    """Two runners of one model: one steps through forward and `sample`, the other through
    `decode_sample`, fed the same tokens with generators of the same seeds; every step's tokens,
    log-probabilities and generator states must agree. Returns the tokens drawn."""
    model, _ = load_policy(name)
    general, whole = _runner(model, dtype, quant), _runner(model, dtype, quant)
    assert whole._native_layers is not None and whole._native_layers[0].has_head
    for r in (general, whole):
        r.forward(r.prepare([BatchItem(p, 0, t) for p, t in zip(PROMPTS, TABLES)]))
    params = [SamplingParams(temperature=t) for t in temps]
    g_general = [torch.Generator().manual_seed(7 + i) for i in range(len(temps))]
    g_whole = [torch.Generator().manual_seed(7 + i) for i in range(len(temps))]
    tokens, positions, drawn = [11, 20, 30], [len(p) for p in PROMPTS], []
    for _ in range(steps):
        items = [BatchItem([t], p, b) for t, p, b in zip(tokens, positions, TABLES)]
        want = sample(general.forward(general.prepare(items)), params, g_general, [[]] * len(temps))
        got = whole.decode_sample(items, list(temps), g_whole)
        assert got == (want.token_ids, want.logprobs)
        for a, b in zip(g_general, g_whole):  # one draw each where the temperature is positive, as torch.rand's
            assert torch.equal(a.get_state(), b.get_state())
        tokens, positions = want.token_ids, [p + 1 for p in positions]
        drawn.append(tokens)
    return drawn


@pytest.mark.parametrize("dtype,quant", [("float32", None), ("bfloat16", None), ("float32", "int8"), ("bfloat16", "q4_1"),
                                         ("bfloat16", "q4_0"), ("float32", "q8_0")])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_whole_step_equals_forward_then_sample(native, name, dtype, quant):
    drawn = whole_equals_general(name, dtype, quant)
    assert len({tuple(row[:2]) for row in drawn}) > 1  # the draws move: the generators were used


def test_whole_step_at_temperature_one_alone_divides_nothing(native):
    whole_equals_general("tiny-llama", "bfloat16", None, temps=(1.0, 1.0, 1.0), steps=2)


def test_steps_the_whole_call_cannot_take_return_none(native):
    model, _ = load_policy("tiny-llama")
    runner = _runner(model, "bfloat16", None)
    g = [torch.Generator()]
    assert runner.decode_sample([BatchItem([5, 9], 0, [0])], [1.0], g) is None  # two tokens: a chunk of prompt
    assert runner.decode_sample([BatchItem([5], 0, [0], num_logits=0)], [1.0], g) is None
    assert runner.decode_sample([BatchItem([5], 0, [0], lora=1)], [1.0], g) is None
    far = runner.rope.max_positions
    assert runner.decode_sample([BatchItem([5], far, [0] * (far // 4 + 1))], [1.0], g) is None
    runner.fused_step = False
    assert runner.decode_sample([BatchItem([5], 0, [0])], [1.0], g) is None


def test_bad_calls_are_refused_with_one_line(native):
    model, _ = load_policy("tiny-llama")
    runner = _runner(model, "float32", None)
    layers, kv = runner._native_layers[0], runner.kv
    g = torch.Generator()

    def call(ids=(5,), positions=(0,), tables=([0],), temps=(1.0,), gens=(g,)):
        return layers.sample(list(ids), list(positions), [list(t) for t in tables], kv.k, kv.v, kv.block_size,
                             runner.num_heads, runner.eps, list(temps), list(gens))

    assert len(call()[0]) == 1
    for kwargs, why in [({"ids": (10_000,)}, "outside the vocabulary"), ({"positions": (10**7,)}, "past the RoPE tables"),
                        ({"positions": (4,)}, "past its block table"), ({"tables": ([99],)}, "outside the cache"),
                        ({"temps": (-1.0,)}, "temperature is negative"), ({"gens": ()}, "a sequence")]:
        with pytest.raises(RuntimeError, match=why):
            call(**kwargs)
    bare = native.DecodeLayers(*_described(runner))
    assert not bare.has_head
    with pytest.raises(RuntimeError, match="without the model's head"):
        bare.sample([5], [0], [[0]], kv.k, kv.v, kv.block_size, runner.num_heads, runner.eps, [1.0], [g])


def _described(runner):
    from longhaul.ops.linear import native_layers
    return (native_layers(runner._exec)[0],)


def _generate(engine, prompts, params):
    engine.flush_prefix_cache()
    return [(o.token_ids, o.logprobs, o.text) for o in engine.generate(prompts, params)]


@pytest.mark.parametrize("case", ["plain", "top_k", "min_tokens", "logprobs"])
def test_engine_takes_the_whole_step_only_where_sampling_allows(native, monkeypatch, case):
    model, tok = load_policy("tiny-llama")
    engine = LLMEngine(model, dtype="bfloat16", tokenizer=tok, adaptive_threads=False, num_kv_blocks=64, block_size=4)
    extra = {"plain": {}, "top_k": {"top_k": 5}, "min_tokens": {"min_tokens": 6}, "logprobs": {"logprobs": 2}}[case]
    params = [SamplingParams(temperature=1.0, max_tokens=10, seed=3, **extra), SamplingParams(temperature=0.0, max_tokens=8),
              SamplingParams(temperature=0.8, max_tokens=10, seed=4)]
    prompts = [tok.encode("the cat"), tok.encode("a dog and"), tok.encode("x")]
    taken = []
    run = engine.runner.decode_sample
    monkeypatch.setattr(engine.runner, "decode_sample", lambda *a: taken.append(run(*a)) or taken[-1])
    whole = _generate(engine, prompts, params)
    monkeypatch.setattr(engine, "_run_whole", lambda batch: None)
    general = _generate(engine, prompts, params)
    assert whole == general
    if case == "plain":
        assert len(taken) >= 9 and all(t is not None for t in taken)
    elif case == "min_tokens":  # EOS is banned for the first six tokens, then the step is whole again
        assert taken and len(taken) < 9
    else:
        assert not taken


def test_detokenizer_calls_the_rust_tokenizer_where_hf_only_passes_on(monkeypatch):
    _, tok = load_policy("tiny-llama")
    assert tok.clean_up_tokenization_spaces is False and detokenizer(tok) is tok._tokenizer
    ids = tok.encode("héllo wörld, the cat  sat")
    for skip in (True, False):
        assert detokenizer(tok).decode(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)
    monkeypatch.setattr(tok, "clean_up_tokenization_spaces", True)
    assert detokenizer(tok) is tok
    assert detokenizer(None) is None
