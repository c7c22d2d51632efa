"""The engine's sampler against plain per-row references, its logprobs, and the stop rules."""

import math

import pytest
import torch

from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams, apply_min_p, apply_top_k, apply_top_p, process_logits, sample


NEG = float("-inf")


def logits_batch(b=6, v=50, seed=0):
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 2


def ref_top_k(row: list[float], k: int) -> list[float]:
    if k == 0:
        return row
    kth = sorted(row, reverse=True)[k - 1]
    return [x if x >= kth else NEG for x in row]


def ref_top_p(row: list[float], p: float) -> list[float]:
    m = max(row)
    probs = [math.exp(x - m) for x in row]
    z = sum(probs)
    keep, mass = set(), 0.0
    for i in sorted(range(len(row)), key=lambda i: -row[i]):
        if mass >= p:
            break
        keep.add(i)
        mass += probs[i] / z
    return [x if i in keep else NEG for i, x in enumerate(row)]


def ref_min_p(row: list[float], p: float) -> list[float]:
    m = max(row)
    return [x if math.exp(x - m) >= p else NEG for x in row]


@pytest.mark.parametrize("fn,ref,vals", [(apply_top_k, ref_top_k, [0, 1, 3, 10, 50, 7]),
                                         (apply_top_p, ref_top_p, [1.0, 0.1, 0.5, 0.9, 0.99, 0.3]),
                                         (apply_min_p, ref_min_p, [0.0, 0.05, 0.1, 0.5, 1.0, 0.2])])
def test_filters_match_a_plain_reference(fn, ref, vals):
    x = logits_batch()
    got = fn(x, torch.tensor(vals))
    want = torch.tensor([ref(row, v) for row, v in zip(x.tolist(), vals)])
    assert torch.equal(torch.isinf(got), torch.isinf(want)), "different tokens kept"
    assert torch.equal(got[~torch.isinf(got)], x[~torch.isinf(want)])


def test_processing_order_is_temperature_min_p_top_k_top_p():
    x = logits_batch(1)
    p = SamplingParams(temperature=0.5, min_p=0.01, top_k=10, top_p=0.8)
    want = x[0].tolist()
    want = [v / 0.5 for v in want]
    want = ref_top_p(ref_top_k(ref_min_p(want, 0.01), 10), 0.8)
    got = process_logits(x, [p])[0]
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)


def test_logprobs_processed_and_raw_with_top_n():
    x = logits_batch(4)
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    params = [SamplingParams(temperature=0.7, top_k=5, logprobs=3), SamplingParams(temperature=0.7, top_k=5, logprobs=3, logprobs_mode="raw"),
              SamplingParams(temperature=0), SamplingParams(temperature=1.3, top_p=0.5, logprobs=2)]
    res = sample(x, params, gens, [[], [], [], []])
    for b, p in enumerate(params):
        proc = process_logits(x[b:b + 1], [p])[0].log_softmax(-1)
        raw = x[b].log_softmax(-1)
        src = raw if p.logprobs_mode == "raw" else proc
        tok = res.token_ids[b]
        assert abs(res.logprobs[b] - src[tok].item()) < 1e-6
        assert proc[tok] > NEG  # never samples a filtered token
        if p.logprobs:
            vals, ids = src.topk(p.logprobs)
            top = res.top_logprobs[b]
            for i, v in zip(ids.tolist(), vals.tolist()):
                assert abs(top[i] - v) < 1e-6
            assert tok in top and len(top) in (p.logprobs, p.logprobs + 1)
        else:
            assert res.top_logprobs[b] is None
    assert res.token_ids[2] == int(x[2].argmax())


def test_banned_tokens_are_never_sampled():
    x = logits_batch(2)
    top = [int(x[0].argmax()), int(x[1].argmax())]
    res = sample(x, [SamplingParams(temperature=0)] * 2, [torch.Generator()] * 2, [[top[0]], []])
    assert res.token_ids[0] != top[0] and res.token_ids[1] == top[1]


def test_per_row_generators_make_sampling_independent_of_the_batch():
    x = logits_batch(3)
    params = [SamplingParams(temperature=1.0)] * 3
    gens = lambda: [torch.Generator().manual_seed(s) for s in (1, 2, 3)]  # noqa: E731
    together = [sample(x, params, gens(), [[]] * 3).token_ids for _ in range(3)]
    alone = sample(x[1:2], params[:1], [torch.Generator().manual_seed(2)], [[]]).token_ids
    assert together[0] == together[1] == together[2] and alone[0] == together[0][1]


def test_sampling_follows_the_distribution():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for _ in range(3000):
        counts[sample(x, [SamplingParams(temperature=1.0)], [g], [[]]).token_ids[0]] += 1
    assert torch.allclose(counts / 3000, torch.tensor([0.5, 0.3, 0.2]), atol=0.03)


@pytest.mark.parametrize("field,value", [("temperature", -1), ("top_p", 0), ("top_k", -2), ("min_p", 1.5), ("max_tokens", 0),
                                         ("min_tokens", 99), ("logprobs", -1), ("logprobs_mode", "both"), ("n", 2), ("stop", [""])])
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})
    with pytest.raises(LonghaulError):
        SamplingParams(**{field: value})


# ---- stop rules, through the engine on a tiny model with lively weights ----------------------

@pytest.fixture(scope="module")
def engine():
    from test_engine import lively

    model, tok = lively("tiny-llama")
    return LLMEngine(model, tokenizer=tok, num_kv_blocks=64)


PROMPT = "def fib(n):\n    return"


def free_run(engine, n=20):
    return engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=n))[0]


def test_max_tokens_and_stop_token(engine):
    free = free_run(engine)
    assert free.finish_reason == "length" and len(free.token_ids) == 20
    stop_tok = free.token_ids[4]
    out = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_tok]))[0]
    first = free.token_ids.index(stop_tok)
    assert out.token_ids == free.token_ids[:first + 1] and out.finish_reason == "stop"


def test_stop_string_cuts_the_text(engine):
    free = free_run(engine)
    stop = free.text[6:8]
    out = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, stop=[stop]))[0]
    cut = free.text.index(stop)
    assert out.finish_reason == "stop" and out.text == free.text[:cut]
    assert free.token_ids[:len(out.token_ids)] == out.token_ids and len(out.token_ids) < 20
    kept = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, stop=stop, include_stop_str_in_output=True))[0]
    assert kept.text == free.text[:cut + len(stop)]


def test_min_tokens_bans_stop_tokens_until_reached(engine):
    free = free_run(engine)
    stop_tok = free.token_ids[0]
    out = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, min_tokens=3, stop_token_ids=[stop_tok]))[0]
    assert stop_tok not in out.token_ids[:3] and len(out.token_ids) >= 3


def test_eos_stops_unless_ignored(engine):
    free = free_run(engine)
    saved = engine.eos_token_ids
    engine.eos_token_ids = {free.token_ids[2]}
    try:
        first = free.token_ids.index(free.token_ids[2])
        stopped = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20))[0]
        ignored = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    finally:
        engine.eos_token_ids = saved
    assert stopped.token_ids == free.token_ids[:first + 1] and stopped.finish_reason == "stop"
    assert ignored.token_ids == free.token_ids and ignored.finish_reason == "length"


def test_engine_logprobs_equal_a_full_hf_forward(engine):
    from test_engine import lively

    model, tok = lively("tiny-llama")
    prompt = tok.encode(PROMPT)
    for mode, temp in (("processed", 0.7), ("raw", 0.7), ("processed", 0.0)):
        out = engine.generate([prompt], SamplingParams(temperature=temp, max_tokens=10, seed=3, logprobs_mode=mode))[0]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1:-1]
        scale = temp if (mode == "processed" and temp > 0) else 1.0
        ref = (logits / scale).log_softmax(-1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        diff = (ref - torch.tensor(out.logprobs)).abs().max().item()
        assert diff < 1e-4, f"{mode} T={temp}: max diff {diff}"


def test_two_level_inverse_cdf_equals_the_flat_one():
    from longhaul.inference.sampling import inverse_cdf

    g = torch.Generator().manual_seed(0)
    w = torch.rand(64, 1000, generator=g) * (torch.rand(64, 1000, generator=g) > 0.7)  # many zero weights
    u = torch.rand(64, generator=g, dtype=torch.float64)
    flat = torch.searchsorted(w.double().cumsum(-1), (u * w.double().sum(-1))[:, None], right=True).squeeze(-1)
    got = inverse_cdf(w, u, chunk=64)
    assert torch.equal(got, flat)
    assert (w.gather(-1, got[:, None]) > 0).all()
    edge = inverse_cdf(w, torch.full((64,), 1 - 1e-17, dtype=torch.float64), chunk=64)  # rounding at the very end
    assert (w.gather(-1, edge[:, None]) > 0).all()
