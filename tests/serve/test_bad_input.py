"""Bad input gets a 4xx with OpenAI's error body naming the problem, and the server keeps
serving: malformed JSON, wrong types, huge max_tokens, a prompt over the context, unknown
models and routes, oversized bodies, and a stream of random bodies (hypothesis)."""

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve.conftest import running_server

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("bad"), max_tokens_cap=16, max_request_bytes=64 * 1024) as (base, _):
        yield base


def post(base, path, **kw):
    return httpx.post(base + path, timeout=30, **kw)


def error_of(r, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("body, param, words", [
    ({"messages": MSG, "temperature": "hot"}, "temperature", "valid number"),
    ({"messages": "hi"}, "messages", "valid list"),
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role", "'system'"),
    ({"messages": MSG, "max_tokens": -1}, "max_tokens", "greater than or equal to 1"),
    ({"messages": MSG, "max_tokens": 10**9}, "max_tokens", "above this server's cap"),
    ({"messages": MSG, "n": 100}, "n", "less than or equal to 16"),
    ({"messages": MSG, "top_p": 0}, "top_p", "greater than 0"),
    ({"messages": MSG, "presence_penalty": 1.0}, "presence_penalty", "not supported"),
    ({"messages": MSG, "logit_bias": {"5": 3}}, "logit_bias", "not supported"),
    ({"messages": MSG, "max_tokens": 5, "min_tokens": 9}, None, "min_tokens"),
    ({"messages": [{"role": "user", "content": "x" * 600}]}, "messages", "maximum context length is 512"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", "not supported"),
])
def test_bad_chat_requests_get_400(server, body, param, words):
    err = error_of(post(server, "/v1/chat/completions", json=body), 400)
    assert err["type"] == "invalid_request_error" and words in err["message"]
    if param:
        assert err["param"] == param


def test_malformed_json_unknown_model_route_and_size(server):
    err = error_of(post(server, "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}), 400)
    assert "not valid JSON" in err["message"]
    assert "JSON object" in error_of(post(server, "/v1/chat/completions", json=[1, 2]), 400)["message"]
    err = error_of(post(server, "/v1/chat/completions", json={"model": "gpt-9", "messages": MSG}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert error_of(httpx.get(server + "/v1/models/gpt-9"), 404)["code"] == "model_not_found"
    assert error_of(httpx.get(server + "/v1/nothing"), 404)["code"] == "not_found"
    assert error_of(httpx.get(server + "/v1/chat/completions"), 405)
    big = {"messages": [{"role": "user", "content": "x" * 70_000}]}
    assert error_of(post(server, "/v1/chat/completions", json=big), 413)["code"] == "request_too_large"
    err = error_of(post(server, "/v1/completions", json={"prompt": [[1, 2], "x"]}), 400)
    assert err["param"] == "prompt"
    assert "token ids" in error_of(post(server, "/v1/completions", json={"prompt": [99999]}), 400)["message"]
    assert error_of(post(server, "/v1/completions", json={"prompt": "a", "suffix": "b"}), 400)["param"] == "suffix"


_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12)
_fields = st.fixed_dictionaries({}, optional={
    "messages": st.one_of(_json, st.just(MSG)), "model": st.one_of(_json, st.just("tiny-llama")), "max_tokens": _json,
    "temperature": _json, "top_p": _json, "n": _json, "stop": _json, "stream": _json, "logprobs": _json, "top_logprobs": _json,
    "tools": _json, "prompt": _json, "seed": _json, "min_tokens": _json})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), body=_fields)
def test_random_bodies_never_break_the_server(server, path, body):
    r = post(server, path, json=body)
    assert r.status_code in (200, 400, 404), r.text
    if r.status_code != 200:
        error_of(r, r.status_code)


def test_still_serving_after_the_stream_of_bad_requests(server):
    for _ in range(30):
        post(server, "/v1/chat/completions", content=b"\xff\xfe garbage", headers={"content-type": "application/json"})
    r = post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert httpx.get(server + "/ready").status_code == 200
