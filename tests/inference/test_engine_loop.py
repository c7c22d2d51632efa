"""The engine loop thread: outputs equal the engine's own generate, requests join a running
batch, aborts and add errors reach their streams, asyncio streams get the newest output."""

import asyncio

import pytest

from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.inference.engine_loop import AsyncStream, EngineLoop, ThreadStream
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


def test_an_idle_loop_ends_its_thread_and_the_next_request_starts_it(model):
    import time

    tok = model[1]
    loop = EngineLoop(engine(model), idle_exit_s=0.05)  # no start(): the first submit starts the thread
    outs = []
    for k in range(2):
        s = ThreadStream()
        loop.submit(f"r{k}", tok.encode("hello"), SamplingParams(max_tokens=5, temperature=0), s)
        outs.append(s.wait(DEADLINE_S).token_ids)
        deadline = time.monotonic() + DEADLINE_S
        while loop._thread is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop._thread is None  # idle: the thread is gone, and the engine is not pinned by it
    assert outs[0] == outs[1] and len(outs[0]) == 5


def test_rollout_calls_from_many_threads_share_one_stepping_thread(model):
    """`generate` over the engine from several threads at once: every step runs on the engine's
    loop thread, and each caller gets exactly what it would alone."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from longhaul.inference import RolloutParams, generate

    eng, tok = engine(model), model[1]
    prompts = [tok.encode(t) for t in ("one", "two two", "three three three", "four")]
    params = RolloutParams(max_new_tokens=9, temperature=1.0)
    alone = [generate(eng, tok, [p], params, seeds=[40 + i])[0].token_ids for i, p in enumerate(prompts)]
    stepping = set()
    step = eng.step
    eng.step = lambda: (stepping.add(threading.get_ident()), step())[1]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: generate(eng, tok, [prompts[i]], params, seeds=[40 + i])[0].token_ids, range(4)))
    assert got == alone and len(stepping) == 1 and threading.get_ident() not in stepping


def test_a_failed_request_stops_the_rest_of_its_call(model):
    # one prompt of a rollout call cannot fit the pool: the call raises that error, and by then
    # the engine holds none of the call's other requests (no step keeps computing for a caller
    # that has left, e.g. while its process exits)
    from longhaul.inference.hf_sampler import RolloutParams
    from longhaul.inference.rollout_sampler import generate

    tok = model[1]
    eng = LLMEngine(model[0], tokenizer=tok, num_kv_blocks=8, block_size=4)  # 32 slots
    short, long = tok.encode("hello"), tok.encode("a prompt far longer than the pool holds " * 3)
    with pytest.raises(LonghaulError, match="KV blocks but the pool has 8"):
        generate(eng, tok, [short, long, short], RolloutParams(max_new_tokens=16, temperature=0.0))
    loop = eng.loop()
    assert loop.num_active == 0 and not eng.has_unfinished_requests()
    ok = generate(eng, tok, [short], RolloutParams(max_new_tokens=4, temperature=0.0))  # the engine still serves
    assert len(ok[0].token_ids) == 4
