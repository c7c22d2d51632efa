"""Real servers on loopback for the serving tests: uvicorn in a thread (in-process) or
`longhaul serve` in a subprocess (for restarts), and a real redis-server when installed."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from longhaul.serve.app import create_app
from longhaul.serve.config import ServeConfig
from tests.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, timeout: float = 60, proc: subprocess.Popen | None = None) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            if httpx.get(base + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"server at {base} not ready after {timeout} s")


@contextlib.contextmanager
def running_server(tmp_path, **overrides):
    """An in-process server: yields (base_url, app). Defaults: tiny-llama in fp32, small limits."""
    import uvicorn

    cfg = ServeConfig(**{"model": "tiny-llama", "dtype": "float32", "max_model_len": 512, "max_num_seqs": 8,
                         "jobs_db": str(tmp_path / "jobs.sqlite"), "job_workers": 1, **overrides})
    app = create_app(cfg)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=2))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    try:
        wait_ready(base)
        yield base, app
    finally:
        server.should_exit = True
        th.join(30)
        sock.close()


def start_cli_server(port: int, *args: str, env: dict | None = None) -> subprocess.Popen:
    """`longhaul serve` as its own process (so a test can kill it)."""
    cmd = [sys.executable, "-m", "longhaul.cli", "serve", "--port", str(port), *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real redis-server on a free loopback port, for the session."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; `make setup` does it as root)")
    port = free_port()
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(d)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)

    def answers() -> bool:
        assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
        try:
            return client.ping()
        except redis.ConnectionError:
            return False

    try:
        wait_until(answers, what="redis-server to answer")
    except AssertionError:
        proc.kill()
        raise
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)
