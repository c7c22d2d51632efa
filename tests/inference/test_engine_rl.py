"""RL hooks: versioned weight updates, pause/resume from another thread, partial rollouts."""

import threading

import pytest
import torch
from test_engine import lively

from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from tests.waiting import DEADLINE_S, Gate


PROMPTS = ["def fib(n):\n    return", "hello there", "a much longer prompt with several words"]


@pytest.fixture(scope="module")
def models():
    old, tok = lively("tiny-qwen2")
    new, _ = lively("tiny-qwen2")
    with torch.no_grad():
        for p in new.parameters():  # a "trained" policy: every weight moved
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    return old, new, tok


def greedy(n=16):
    return SamplingParams(temperature=0, max_tokens=n)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_update_weights_equals_a_fresh_engine(models, tmp_path, dtype):
    old, new, tok = models
    fresh = [o.token_ids for o in LLMEngine(new, dtype=dtype, tokenizer=tok, num_kv_blocks=64).generate(PROMPTS, greedy())]
    eng = LLMEngine(old, dtype=dtype, tokenizer=tok, num_kv_blocks=64)
    before = [o.token_ids for o in eng.generate(PROMPTS, greedy())]
    assert before != fresh
    assert eng.update_weights(new.state_dict(), version=1) > 0
    outs = eng.generate(PROMPTS, greedy())
    assert [o.token_ids for o in outs] == fresh and all(o.weight_version == [1] * len(o.token_ids) for o in outs)
    assert eng.stats()["weight_version"] == 1
    old.save_pretrained(tmp_path)  # and back, from a safetensors directory
    eng.update_weights(tmp_path, version=2)
    assert [o.token_ids for o in eng.generate(PROMPTS, greedy())] == before


def test_update_drops_the_prefix_cache(models):
    old, new, tok = models
    eng = LLMEngine(old, tokenizer=tok, num_kv_blocks=64, block_size=2)
    eng.generate(PROMPTS[:1], greedy())
    eng.update_weights(new.state_dict(), version=1)
    hits = eng.stats()["prefix_cache_hits"]
    eng.generate(PROMPTS[:1], greedy())
    assert eng.stats()["prefix_cache_hits"] == hits  # nothing computed under the old weights is reused


def test_bad_weights_are_refused(models):
    old, _, tok = models
    eng = LLMEngine(old, tokenizer=tok, num_kv_blocks=16)
    with pytest.raises(LonghaulError, match="does not belong"):
        eng.update_weights({"model.layers.0.attn.nope": torch.zeros(1)}, 1)
    with pytest.raises(LonghaulError, match="shape"):
        eng.update_weights({"model.norm.weight": torch.zeros(3)}, 1)
    eng.update_weights({"model.norm.weight": torch.full_like(old.model.norm.weight, 2.0)}, 1)  # a partial update
    assert torch.all(eng.runner.norm == 2.0)


def continuation(new, tok, prompt_ids, n):
    """What the new weights produce greedily after prompt_ids (prompt + tokens so far)."""
    return LLMEngine(new, tokenizer=tok, num_kv_blocks=64).generate([prompt_ids], greedy(n))[0].token_ids


def test_pause_update_resume_continues_in_flight_requests(models):
    old, new, tok = models
    eng = LLMEngine(old, tokenizer=tok, num_kv_blocks=64)
    for i, p in enumerate(PROMPTS):
        eng.add_request(str(i), p, greedy(12))
    for _ in range(5):
        eng.step()
    eng.pause()
    assert eng.step() == []  # paused: nothing runs
    eng.update_weights(new.state_dict(), version=7)
    assert eng.stats()["num_recomputed_total"] == len(PROMPTS)  # all three prefill again under version 7
    eng.resume()
    final = {}
    while eng.has_unfinished_requests():
        final.update({o.request_id: o for o in eng.step() if o.finished})
    for i, p in enumerate(PROMPTS):
        o = final[str(i)]
        assert o.weight_version == [0] * 5 + [7] * 7
        assert o.token_ids[5:] == continuation(new, tok, tok.encode(p) + o.token_ids[:5], 7)


def test_pause_from_another_thread_mid_generate(models):
    old, new, tok = models
    eng = LLMEngine(old, tokenizer=tok, num_kv_blocks=64)
    result = {}
    # the generating thread is held before its step after token 6 until the pause is in: mid-generation on any machine
    eng.step_hook = gate = Gate(lambda: eng.stats()["generation_tokens_total"] >= 6)
    waiting = threading.Event()
    wait = eng._cond.wait

    def wait_and_tell(timeout=None):  # generate's loop waits on this condition while the engine is paused
        waiting.set()
        return wait(timeout)

    eng._cond.wait = wait_and_tell
    worker = threading.Thread(target=lambda: result.update(outs=eng.generate(PROMPTS, greedy(40))))
    worker.start()
    try:
        gate.wait(alive=worker.is_alive)
        eng.pause()
        paused_at = eng.stats()["generation_tokens_total"]
    finally:
        gate.open()
    assert waiting.wait(DEADLINE_S)  # the generate loop came round to wait for the resume ...
    assert eng.stats()["generation_tokens_total"] == paused_at  # ... without a token more
    eng.update_weights(new.state_dict(), version=1)
    eng.resume()
    worker.join(timeout=DEADLINE_S)
    assert not worker.is_alive()
    for p, o in zip(PROMPTS, result["outs"]):
        k = o.weight_version.index(1)
        assert o.weight_version == [0] * k + [1] * (len(o.token_ids) - k) and 0 < k < 40
        assert o.token_ids[k:] == continuation(new, tok, tok.encode(p) + o.token_ids[:k], 40 - k)


def test_keep_kv_update_decodes_on_over_the_old_weights_kv(models):
    """keep_kv: no re-prefill; each later token is what the new weights give over the K/V the
    old weights computed (checked against HF with the old model's past_key_values)."""
    old, new, tok = models
    eng = LLMEngine(old, tokenizer=tok, num_kv_blocks=64)
    for i, p in enumerate(PROMPTS):
        eng.add_request(str(i), p, greedy(12))
    for _ in range(5):  # the prefill samples token 0, four decode steps tokens 1-4 (K/V of prompt + tokens 0-3 held)
        eng.step()
    eng.update_weights(new.state_dict(), version=7, keep_kv=True)
    final = {}
    while eng.has_unfinished_requests():
        final.update({o.request_id: o for o in eng.step() if o.finished})
    assert eng.stats()["num_recomputed_total"] == 0  # nothing was prefilled again
    worst = 0.0
    for i, p in enumerate(PROMPTS):
        o, prompt = final[str(i)], tok.encode(p)
        assert o.weight_version == [0] * 5 + [7] * 7
        ids, held = prompt + o.token_ids, len(prompt) + 4
        with torch.no_grad():
            past = old(torch.tensor([ids[:held]]), use_cache=True).past_key_values
            logits = new(torch.tensor([ids[held:-1]]), cache=past, use_cache=True).logits[0]
            recomputed = new(torch.tensor([ids[:-1]])).logits[0, held:]
        want = torch.log_softmax(logits.double(), -1)
        got = torch.tensor(o.logprobs[5:], dtype=torch.float64)
        assert o.token_ids[5:] == want.argmax(-1).tolist()
        picked = want.gather(1, torch.tensor(o.token_ids[5:])[:, None])[:, 0]
        err = (got - picked).abs().max().item()
        assert err < 1e-4, f"max |logprob - reference| = {err}"
        redo = torch.log_softmax(recomputed.double(), -1).gather(1, torch.tensor(o.token_ids[5:])[:, None])[:, 0]
        worst = max(worst, (redo - picked).abs().max().item())
    assert worst > 1e-3  # the old K/V made a difference, so the check above could tell the two apart


def test_keep_kv_blocks_never_enter_the_prefix_cache(models):
    """A sequence kept across an update attends over old K/V: its later blocks are never shared,
    even where a request prefilled under the new weights registered the blocks before them."""
    old, new, tok = models
    eng = LLMEngine(old, tokenizer=tok, num_kv_blocks=64, block_size=2)
    eng.add_request("kept", PROMPTS[2], greedy(24))
    for _ in range(5):
        eng.step()
    so_far = list(eng.requests["kept"].token_ids)  # prompt + 5 tokens
    eng.update_weights(new.state_dict(), version=1, keep_kv=True)
    eng.add_request("fresh", so_far, greedy(1))  # the same tokens, prefilled under the new weights and cached
    done = {}
    while eng.has_unfinished_requests():
        done.update({o.request_id: o for o in eng.step() if o.finished})
    hits = eng.stats()["prefix_cache_hits"]
    eng.generate([tok.encode(PROMPTS[2]) + done["kept"].token_ids], greedy(1))
    gained = eng.stats()["prefix_cache_hits"] - hits
    assert 0 < gained <= len(so_far), f"{gained} tokens hit; only the fresh request's {len(so_far)} may"
