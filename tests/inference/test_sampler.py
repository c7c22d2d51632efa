import pytest
import torch

from longhaul.agent.single_turn import encode_prompt
from longhaul.inference import RolloutParams, generate
from longhaul.models import load_policy
from longhaul.rl.logprobs import completion_logprobs

TEXTS = ["hello there", "a much longer prompt with several words in it", "x"]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_greedy_matches_hf_generate_with_mixed_lengths(name):
    model, tok = load_policy(name)
    prompts = [encode_prompt(tok, t) for t in TEXTS]
    outs = generate(model, tok, prompts, RolloutParams(max_new_tokens=24, temperature=0))
    for p, o in zip(prompts, outs):
        ref = model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False)[0, len(p):].tolist()
        assert o.token_ids == ref[: len(o.token_ids)]
        assert o.finish_reason == ("stop" if len(o.token_ids) < 24 else "length")


def test_logprobs_match_a_full_forward():
    model, tok = load_policy("tiny-qwen2")
    prompts = [encode_prompt(tok, t) for t in TEXTS]
    outs = generate(model, tok, prompts, RolloutParams(max_new_tokens=12, temperature=0.7), seed=3)
    pairs = [(p, o.token_ids) for p, o in zip(prompts, outs)]
    with torch.no_grad():
        logp, mask, _ = completion_logprobs(model, pairs, tok.pad_token_id, temperature=0.7)
    for b, o in enumerate(outs):
        got = torch.tensor(o.logprobs)
        diff = (logp[b, : len(got)] - got).abs().max().item()
        assert diff < 1e-4, f"max diff {diff}"


def test_seeded_sampling_is_deterministic_and_seed_dependent():
    model, tok = load_policy("tiny-llama")
    prompts = [encode_prompt(tok, "hi")] * 4
    p = RolloutParams(max_new_tokens=10, temperature=1.0)
    a = [o.token_ids for o in generate(model, tok, prompts, p, seed=1)]
    b = [o.token_ids for o in generate(model, tok, prompts, p, seed=1)]
    c = [o.token_ids for o in generate(model, tok, prompts, p, seed=2)]
    assert a == b and a != c


def test_stop_string_ends_a_row():
    model, tok = load_policy("tiny-llama")
    prompts = [encode_prompt(tok, "hi")]
    free = generate(model, tok, prompts, RolloutParams(max_new_tokens=20, temperature=0))[0]
    text = tok.decode(free.token_ids[:5])
    stopped = generate(model, tok, prompts, RolloutParams(max_new_tokens=20, temperature=0, stop=(text[-1],)))[0]
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) <= 5


def test_top_p_keeps_only_the_nucleus():
    from longhaul.inference.hf_sampler import _process

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    logp = _process(logits, RolloutParams(temperature=1.0, top_p=0.8))
    assert torch.isinf(logp[0, 2:]).all()
    assert torch.allclose(logp[0, :2].exp(), torch.tensor([0.625, 0.375]), atol=1e-6)


def test_invalid_sampling_params():
    with pytest.raises(ValueError, match="top_p"):
        RolloutParams(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        RolloutParams(max_new_tokens=0)
