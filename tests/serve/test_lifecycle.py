"""Readiness and logs: /ready is 503 until the model is loaded and warmed up (and says why when
loading failed) while /health answers; every request gets an id, echoed and logged as JSON."""

import json
import logging

import httpx
from fastapi.testclient import TestClient

from longhaul.serve.app import create_app
from longhaul.serve.config import ServeConfig
from longhaul.serve.logs import JsonFormatter
from tests.serve.conftest import running_server
from tests.waiting import wait_until


def test_not_ready_before_start_up_and_failed_when_loading_fails(tmp_path):
    app = create_app(ServeConfig(model="tiny-llama", jobs_db=str(tmp_path / "a.sqlite")))
    client = TestClient(app)  # no lifespan: nothing loaded, no warm-up
    assert client.get("/health").status_code == 200
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["status"] == "loading" and r.headers["retry-after"] == "5"
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    broken = create_app(ServeConfig(model=str(tmp_path / "missing-model"), jobs_db=str(tmp_path / "b.sqlite")))
    with TestClient(broken) as c:
        body = wait_until(lambda: (b := c.get("/ready").json())["status"] != "loading" and b, what="loading to end")
        assert body["status"] == "failed" and "not found" in body["error"] and c.get("/health").status_code == 200


def test_requests_get_ids_and_json_access_lines(tmp_path, caplog):
    with running_server(tmp_path, api_keys=["k-log"]) as (base, _):
        with caplog.at_level(logging.INFO, logger="longhaul.serve"):
            r = httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                           headers={"Authorization": "Bearer k-log", "x-request-id": "req-test-1"}, timeout=30)
            other = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer k-log"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-test-1"
    assert other.headers["x-request-id"].startswith("req-") and other.headers["x-request-id"] != "req-test-1"
    (rec,) = [x for x in caplog.records if getattr(x, "request_id", None) == "req-test-1"]
    line = json.loads(JsonFormatter().format(rec))
    assert line["msg"] == "request" and line["status"] == 200 and line["path"] == "/v1/chat/completions"
    assert line["key"] == "key-1" and line["completion_tokens"] == r.json()["usage"]["completion_tokens"] and line["seconds"] > 0
