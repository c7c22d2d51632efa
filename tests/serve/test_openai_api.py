"""Conformance with the real `openai` client against a real uvicorn server on loopback
(tiny-llama): model list, chat, streaming (SSE ending in [DONE], include_usage), logprobs and
top_logprobs, vLLM's min_tokens / ignore_eos, stop strings (streamed and not), n with seeds,
and the legacy completions endpoint. Greedy outputs are checked against the engine itself."""

import json
import socket

import httpx
import openai
import pytest

from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.serve.openai_api.chat import render
from longhaul.serve.openai_api.protocol import ChatCompletionRequest
from tests.serve.conftest import running_server
from tests.waiting import wait_until

MSG = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("openai"), max_model_len=4096) as (base, app):
        yield base, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference():
    """The same tiny model in its own engine: what greedy requests must return."""
    model, tok = load_policy("tiny-llama")
    eng = LLMEngine(model, tokenizer=tok, num_kv_blocks=64)

    def greedy(messages, n):
        ids = render(tok, ChatCompletionRequest.model_validate({"messages": messages}))
        return ids, eng.generate([ids], SamplingParams(max_tokens=n, temperature=0, logprobs=3))[0]

    return greedy


def test_model_list(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-llama"] and models[0].owned_by == "longhaul"
    assert client.models.retrieve("tiny-llama").model_extra["max_model_len"] == 4096


def test_chat_greedy_equals_the_engine(client, reference):
    r = client.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=12, temperature=0)
    ids, ref = reference(MSG, 12)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == ref.text
    assert choice.finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), len(ref.token_ids))
    assert r.usage.total_tokens == len(ids) + len(ref.token_ids) and r.object == "chat.completion"


def test_streaming_matches_non_streaming_and_ends_with_done(client, server, reference):
    chunks = list(client.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=12, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    _, ref = reference(MSG, 12)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert all(c.usage is None for c in chunks[:-1])
    body = {"model": "tiny-llama", "messages": MSG, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server[0] + "/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    assert all(json.loads(line[6:])["object"] == "chat.completion.chunk" for line in lines[:-1])


def test_logprobs_and_top_logprobs(client, reference):
    r = client.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=3)
    _, ref = reference(MSG, 8)
    content = r.choices[0].logprobs.content
    assert len(content) == len(ref.token_ids) == r.usage.completion_tokens
    assert max(abs(c.logprob - lp) for c, lp in zip(content, ref.logprobs)) < 1e-5
    for c in content:
        tops = [t.logprob for t in c.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert abs(c.top_logprobs[0].logprob - c.logprob) < 1e-6 and c.top_logprobs[0].token == c.token  # greedy: the argmax
        assert bytes(c.bytes).decode("utf-8", errors="replace") == c.token
    joined = b"".join(bytes(c.bytes) for c in content if c.token != "<|im_end|>")
    assert joined.decode("utf-8", errors="replace") == r.choices[0].message.content
    streamed = list(client.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=8, temperature=0, logprobs=True,
                                                   top_logprobs=2, stream=True))
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in entries] == [c.token for c in content] and all(len(e.top_logprobs) == 2 for e in entries)


def test_min_tokens_and_ignore_eos_give_exactly_max_tokens(client):
    for stream in (False, True):
        kw = dict(model="tiny-llama", messages=MSG, max_tokens=40, temperature=1.0, extra_body={"min_tokens": 40, "ignore_eos": True})
        if stream:
            chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
            assert chunks[-1].usage.completion_tokens == 40
        else:
            r = client.chat.completions.create(**kw)
            assert r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length"


def test_stop_string_is_cut_the_same_streamed_or_not(client):
    kw = dict(model="tiny-llama", messages=MSG, max_tokens=32, temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw).choices[0].message.content
    k = next(k for k in range(4, len(full) - 2) if full[k:k + 2].isascii() and full.find(full[k:k + 2]) == k)
    stop = full[k:k + 2]  # a seeded request draws the same tokens, so the cut lands exactly here
    cut = client.chat.completions.create(**kw, stop=[stop])
    assert cut.choices[0].message.content == full[:k] and cut.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(**kw, stop=[stop], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full[:k]


def test_n_choices_with_a_seed_are_reproducible(client):
    kw = dict(model="tiny-llama", messages=MSG, max_tokens=10, temperature=1.0, n=3, seed=11)
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2] and texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1  # choice i is sampled with seed + i
    streamed = list(client.chat.completions.create(**kw, stream=True))
    for i, text in enumerate(texts):
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices and c.choices[0].index == i) == text


def test_completions_prompt_forms_and_logprobs(client):
    r = client.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=6, temperature=0, logprobs=2)
    text = r.choices[0].text
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens == 6
    assert lp.text_offset[0] == 0 and all(len(t) <= 2 for t in lp.top_logprobs)
    tok = load_policy("tiny-llama")[1]
    ids = tok.encode("Once upon")
    by_ids = client.completions.create(model="tiny-llama", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == text and by_ids.usage.prompt_tokens == len(ids)
    batch = client.completions.create(model="tiny-llama", prompt=["Once upon", "Twice"], max_tokens=6, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == text
    echo = client.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=6, temperature=0, echo=True)
    assert echo.choices[0].text == "Once upon" + text
    streamed = list(client.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text


def test_a_client_that_hangs_up_is_aborted_in_the_engine(server):
    base, app = server
    eng = app.state.server.engine
    body = {"messages": MSG, "max_tokens": 4000, "min_tokens": 4000, "ignore_eos": True}  # seconds of work
    with httpx.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as resp:
        next(resp.iter_lines())  # one chunk, then hang up

    def aborts() -> float:
        lines = [line for line in httpx.get(base + "/metrics", timeout=30).text.splitlines()
                 if line.startswith('longhaul:request_success_total{finished_reason="abort"')]
        return float(lines[0].split()[-1]) if lines else 0.0

    wait_until(lambda: aborts() >= 1 and not eng.has_unfinished_requests(), interval=0.05, what="the streamed request's abort")
    # Not streamed: the client hangs up once the request is in the engine (not after a fixed time, which a loaded
    # server may take just to read the request), and the engine is paused meanwhile so it cannot finish first.
    host, port = base.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    eng.pause()
    try:
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (host.encode(), len(payload), payload))
            wait_until(eng.has_unfinished_requests, what="the request to reach the engine")
        wait_until(lambda: not eng.has_unfinished_requests(), what="the request to be aborted")
    finally:
        eng.resume()
    wait_until(lambda: aborts() >= 2, interval=0.05, what="both aborts to be counted")  # counted just after they leave
    assert aborts() == 2
