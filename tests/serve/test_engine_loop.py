"""The engine loop thread: outputs equal the engine's own generate, requests join a running
batch, aborts and add errors reach their streams, asyncio streams get the newest output."""

import asyncio

import pytest

from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.serve.engine_loop import AsyncStream, EngineLoop, ThreadStream
from tests.waiting import DEADLINE_S, Gate


@pytest.fixture(scope="module")
def model():
    return load_policy("tiny-llama")


def engine(model, **kw):
    return LLMEngine(model[0], tokenizer=model[1], num_kv_blocks=64, **kw)


def test_threaded_requests_equal_generate(model):
    tok = model[1]
    prompts = [tok.encode(t) for t in ("hello", "a longer prompt here", "x")]
    params = [SamplingParams(max_tokens=12, temperature=0), SamplingParams(max_tokens=7, temperature=1.0, seed=3),
              SamplingParams(max_tokens=20, temperature=0.7, top_p=0.9, seed=9)]
    ref = engine(model).generate(prompts, params)
    loop = EngineLoop(engine(model))
    loop.start()
    try:
        streams = [ThreadStream() for _ in prompts]
        for i, (p, sp, s) in enumerate(zip(prompts, params, streams)):
            loop.submit(f"r{i}", p, sp, s)
        outs = [s.wait(DEADLINE_S) for s in streams]
    finally:
        loop.stop()
    for o, r in zip(outs, ref):
        assert o.token_ids == r.token_ids and o.finished and o.finish_reason == r.finish_reason
        assert max(abs(a - b) for a, b in zip(o.logprobs, r.logprobs)) < 1e-6


def test_add_error_and_abort_reach_the_stream(model):
    eng = engine(model, max_model_len=64)
    loop = EngineLoop(eng)
    loop.start()
    try:
        bad = ThreadStream()
        loop.submit("long", list(range(3, 80)), SamplingParams(max_tokens=4), bad)
        with pytest.raises(LonghaulError, match="max_model_len"):
            bad.wait(DEADLINE_S)
        slow = ThreadStream()
        # the loop thread is held before the step after slow's first token until the abort is queued: it is
        # applied before the next step, however the threads are scheduled, so slow never runs to its end
        eng.step_hook = gate = Gate(lambda: slow.latest is not None)
        loop.submit("slow", [5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True, temperature=0), slow)
        try:
            gate.wait()
            loop.abort("slow")
        finally:
            gate.open()
        ok = ThreadStream()
        loop.submit("after", [5, 6], SamplingParams(max_tokens=3, temperature=0), ok)
        assert len(ok.wait(DEADLINE_S).token_ids) == 3
        assert not eng.has_unfinished_requests() and "slow" not in eng.requests
        assert len(slow.latest.token_ids) < 50
    finally:
        loop.stop()


def test_async_stream_reads_the_newest_cumulative_output(model):
    loop = EngineLoop(engine(model))
    loop.start()

    async def run():
        s = AsyncStream(asyncio.get_running_loop())
        loop.submit("a", [9, 10, 11], SamplingParams(max_tokens=16, ignore_eos=True, temperature=0), s)
        seen = []
        while True:
            out = await s.next()
            seen.append(len(out.token_ids))
            if out.finished:
                return seen

    try:
        seen = asyncio.run(run())
    finally:
        loop.stop()
    assert seen == sorted(set(seen)) and seen[-1] == 16  # strictly growing, ends complete
