"""Who may use the server and how much: API keys (401 with OpenAI's body; probes and metrics
stay open), per-key rate limits on requests and tokens (429 + Retry-After + x-ratelimit-*),
the bounded admission queue (503 + Retry-After) and the token-bucket arithmetic itself."""

import json
import threading

import httpx
import openai
import pytest

from longhaul.errors import LonghaulError
from longhaul.serve.auth import ApiKey, digest, load_keys
from longhaul.serve.openai_api.protocol import APIError
from longhaul.serve.ratelimit import RateLimiter
from tests.serve.conftest import running_server
from tests.waiting import DEADLINE_S, Gate

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    keys = d / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "alice", "key": "sk-alice"},
        {"name": "bob", "key_sha256": digest("sk-bob"), "requests_per_minute": 2},
        {"name": "carol", "key": "sk-carol", "tokens_per_minute": 60}]}))
    # the engine in this process: the full-queue test holds it with a step hook, which cannot reach another process
    with running_server(d, api_keys=["sk-plain"], api_keys_file=str(keys), max_num_seqs=1, max_queued_requests=0,
                        engine_process=False) as (base, app):
        yield base, app


@pytest.fixture(scope="module")
def server(served):
    return served[0]


def client(base, key):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)


def test_keys_are_required_and_probes_stay_open(server):
    for key in ("sk-alice", "sk-plain"):
        assert client(server, key).chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=2).choices
    with pytest.raises(openai.AuthenticationError) as e:
        client(server, "sk-wrong").models.list()
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key" and e.value.body["type"] == "invalid_request_error"
    r = httpx.post(server + "/v1/chat/completions", json={"messages": MSG})
    assert r.status_code == 401 and r.json()["error"]["message"].startswith("You didn't provide an API key")
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.post(server + "/v1/jobs", json={"family": "echo"}).status_code == 401
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(server + path).status_code == 200


def test_requests_per_minute_gives_429_with_retry_after(server):
    bob = client(server, "sk-bob")
    for _ in range(2):
        raw = bob.chat.completions.with_raw_response.create(model="tiny-llama", messages=MSG, max_tokens=1)
        assert raw.headers["x-ratelimit-limit-requests"] == "2"
    assert raw.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as e:
        bob.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=1)
    h = e.value.response.headers
    assert e.value.status_code == 429 and e.value.body["code"] == "rate_limit_exceeded" and e.value.body["type"] == "requests"
    assert 1 <= int(h["retry-after"]) <= 30 and h["x-ratelimit-remaining-requests"] == "0" and "x-ratelimit-reset-requests" in h
    assert client(server, "sk-alice").chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=1).choices  # others unaffected


def test_tokens_per_minute_counts_generated_tokens(server):
    carol = client(server, "sk-carol")
    r = carol.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=30, extra_body={"min_tokens": 30})
    assert r.usage.total_tokens > 40  # prompt ~20 + 30 generated: most of the 60-token minute
    with pytest.raises(openai.RateLimitError) as e:
        carol.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=30)
    assert e.value.body["type"] == "tokens" and int(e.value.response.headers["retry-after"]) >= 1
    assert e.value.response.headers["x-ratelimit-limit-tokens"] == "60"


def test_a_full_admission_queue_gives_503_then_recovers(served):
    server, app = served
    eng = app.state.server.engine
    alice = client(server, "sk-alice")
    done = []

    def long_request():
        stream = alice.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=300, stream=True,
                                               extra_body={"min_tokens": 300, "ignore_eos": True})
        for _ in stream:
            pass
        done.append(True)

    # the engine is held mid-request (after its first token) until the 503 is in: the long request still holds
    # the one admission slot then, however slowly this thread gets to send the second request
    before = eng.stats()["generation_tokens_total"]
    eng.step_hook = gate = Gate(lambda: eng.stats()["generation_tokens_total"] > before)
    t = threading.Thread(target=long_request)
    t.start()
    try:
        gate.wait(alive=t.is_alive)
        with pytest.raises(openai.APIStatusError) as e:
            alice.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=1)
    finally:
        gate.open()
        eng.step_hook = None
    assert e.value.status_code == 503 and int(e.value.response.headers["retry-after"]) >= 1
    assert e.value.body["code"] == "server_busy"
    t.join(DEADLINE_S)
    assert done and alice.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=1).choices


def test_token_buckets_refill_continuously():
    now = [0.0]
    rl = RateLimiter(clock=lambda: now[0])
    key = ApiKey("k", "d", requests_per_minute=6, tokens_per_minute=600)  # refill 0.1 request/s, 10 tokens/s
    for _ in range(6):
        rl.admit(key, 10)
    with pytest.raises(APIError) as e:
        rl.admit(key, 10)
    assert e.value.status == 429 and e.value.type == "requests" and e.value.headers["Retry-After"] == "10"
    now[0] = 10.0
    h = rl.admit(key, 10)  # one request refilled; tokens back to the 600 cap, minus 10
    assert h["x-ratelimit-remaining-requests"] == "0" and h["x-ratelimit-remaining-tokens"] == "590"
    rl.charge(key, 700)  # generated tokens overdraw the bucket to -110 ...
    now[0] = 15.0
    with pytest.raises(APIError) as e:
        rl.admit(key, 10)  # ... -60 now: 70 more tokens are 7 s away (the request bucket needs only 5 s)
    assert e.value.type == "tokens" and e.value.headers["Retry-After"] == "7"
    now[0] = 200.0
    assert rl.admit(key, 10)["x-ratelimit-remaining-tokens"] == "590"
    assert rl.admit(ApiKey("free", "f"), 10**6) == {}  # a key without quotas is never limited


def test_keys_file_errors_are_one_line(tmp_path):
    bad = tmp_path / "keys.yaml"
    bad.write_text("keys:\n  - name: a\n    key: x\n    requests_per_minute: -1\n")
    with pytest.raises(LonghaulError, match="requests_per_minute of key 'a' must be a positive integer"):
        load_keys([], str(bad))
    with pytest.raises(LonghaulError, match="not found"):
        load_keys([], str(tmp_path / "missing.json"))
    with pytest.raises(LonghaulError, match="configured twice"):
        load_keys(["same", "same"], None)
    store = load_keys(["k1"], None, default_rpm=5)
    assert store.authenticate("Bearer k1").requests_per_minute == 5
