"""The engine in its own process (the server's default): the same responses as the in-process
thread (greedy outputs token-identical, logprobs, stop strings, streaming and not, n > 1), one
message per engine step and small ones, aborts, pause/resume and update_weights answered by
the engine process, an engine killed mid-request failing its requests with a clear error and
/health saying so, and no engine process left behind by a server that stops or is killed."""

import multiprocessing
import os
import signal
import threading

import httpx
import openai
import pytest

from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.serve.engine_core import Core
from tests.serve.conftest import free_port, running_server, start_cli_server, wait_ready
from tests.waiting import DEADLINE_S, wait_until

MSG = [{"role": "user", "content": "Tell me about the sea."}]
LONG = [{"role": "user", "content": "the sea " * 150}]  # ~1,200 prompt tokens (byte tokenizer)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> dict[int, str]:
    """The child processes of `pid`: their command lines by pid."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for c in f.read().split():
                with open(f"/proc/{c}/cmdline", "rb") as cmd:
                    out[int(c)] = cmd.read().replace(b"\0", b" ").decode()
    return out


def first_difference(a, b, tol: float = 1e-5, at: str = "") -> str | None:
    """Where `a` and `b` first differ (None if nowhere); floats (logprobs) within `tol`, since a
    batch of another shape may round differently."""
    if isinstance(a, float) and isinstance(b, float):
        return None if abs(a - b) <= tol else f"{at}: {a} != {b}"
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{at}: keys {sorted(a)} != {sorted(b)}"
        return next((d for k in a if (d := first_difference(a[k], b[k], tol, f"{at}.{k}"))), None)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{at}: {len(a)} items != {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, tol, f"{at}[{i}]"))), None)
    return None if a == b else f"{at}: {a!r} != {b!r}"


def responses(base: str) -> tuple[str, list]:
    """A stop string the greedy text contains, and what a client sees for a fixed set of
    requests (minus ids and timestamps)."""
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    chat = dict(model="tiny-llama", messages=MSG, max_tokens=12, temperature=0)
    stop = c.chat.completions.create(**chat).choices[0].message.content[4:6]  # its output is cut where the stop begins
    out = [c.chat.completions.create(**chat, logprobs=True, top_logprobs=3).model_dump(exclude={"id", "created"}),
           c.chat.completions.create(**chat, stop=[stop]).model_dump(exclude={"id", "created"}),
           c.chat.completions.create(**{**chat, "messages": LONG}).model_dump(exclude={"id", "created"}),
           c.completions.create(model="tiny-llama", prompt=["Once upon", "Twice"], max_tokens=8, temperature=0,
                                logprobs=2).model_dump(exclude={"id", "created"}),
           c.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=8, temperature=0.9, n=2,
                                seed=7).model_dump(exclude={"id", "created"})]
    for kw in ({}, {"stop": [stop]}):
        chunks = list(c.chat.completions.create(**chat, stream=True, stream_options={"include_usage": True}, **kw))
        # how many chunks the text comes in depends on timing (a reader that falls behind gets what is new at once)
        out.append(["".join(x.choices[0].delta.content or "" for x in chunks if x.choices),
                    [x.choices[0].finish_reason for x in chunks if x.choices and x.choices[0].finish_reason],
                    chunks[-1].usage.model_dump()])
    return stop, out


@pytest.fixture(scope="module")
def thread_greedy(tmp_path_factory):
    """The in-process thread's answers: what the engine process must give, token for token."""
    with running_server(tmp_path_factory.mktemp("thread"), engine_process=False, max_model_len=2048) as (base, _):
        return responses(base)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("process"), max_model_len=2048) as (base, app):
        yield base, app
    proc = app.state.server.loop._proc
    assert not proc.is_alive() and proc.exitcode == 0 and not alive(proc.pid)  # a clean stop: the engine exited by itself


def test_engine_process_answers_as_the_thread_does(served, thread_greedy):
    base, app = served
    assert app.state.server.config.engine_process and app.state.server.loop._proc.is_alive()
    stop, got = responses(base)
    assert stop == thread_greedy[0] and first_difference(got, thread_greedy[1]) is None, first_difference(got, thread_greedy[1])
    assert got[1]["choices"][0]["finish_reason"] == "stop" and stop not in got[1]["choices"][0]["message"]["content"]


def test_one_message_per_engine_step_and_a_small_one(served):
    base, app = served
    loop = app.state.server.loop
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    threads = [threading.Thread(target=c.chat.completions.create,
                                kwargs=dict(model="tiny-llama", messages=m, max_tokens=40, extra_body={"min_tokens": 40}))
               for m in (MSG, LONG, MSG, LONG)]
    steps0, messages0 = loop.steps, loop.messages
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    # every message carried a step (nothing was aborted or refused, so no message without one), and each is a
    # delta: far below the ~1,200-token prompts a cumulative output would repeat every step
    assert loop.steps - steps0 >= 40 and loop.messages - messages0 == loop.steps - steps0
    assert loop.messages == loop.steps and loop.max_message_bytes < 1500, (loop.max_message_bytes, loop.messages)
    assert loop.num_active == 0 and loop.num_pending == 0


def test_a_stream_the_client_leaves_is_aborted_in_the_engine_process(served):
    base, app = served
    eng, loop = app.state.server.engine, app.state.server.loop
    body = {"messages": MSG, "max_tokens": 1500, "min_tokens": 1500, "ignore_eos": True, "stream": True}

    def aborts() -> float:
        lines = [line for line in httpx.get(base + "/metrics", timeout=30).text.splitlines()
                 if line.startswith('longhaul:request_success_total{finished_reason="abort"')]
        return float(lines[0].split()[-1]) if lines else 0.0

    before = aborts()
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as resp:
        next(resp.iter_lines())  # one chunk, then hang up
    gauges = dict(line.rsplit(" ", 1) for line in httpx.get(base + "/metrics", timeout=30).text.splitlines()
                  if line.startswith(("longhaul:engine_threads", "longhaul:thread_switches_total")))
    threads = next(float(v) for k, v in gauges.items() if k.startswith("longhaul:engine_threads"))
    assert 1 <= threads <= os.cpu_count() and any(k.startswith("longhaul:thread_switches_total") for k in gauges)
    wait_until(lambda: aborts() == before + 1 and not eng.has_unfinished_requests() and loop.num_active == 0, interval=0.05,
               what="the abort to reach the engine process and come back")


def test_rare_calls_run_in_the_engine_process(served, tmp_path):
    base, app = served
    eng, loop = app.state.server.engine, app.state.server.loop
    # a paused engine takes a request but steps it only once resumed
    got, before = [], eng.stats()["generation_tokens_total"]
    eng.pause()
    try:
        t = threading.Thread(target=lambda: got.append(httpx.post(base + "/v1/chat/completions", timeout=DEADLINE_S,
                                                                  json={"messages": MSG, "max_tokens": 3, "min_tokens": 3})))
        t.start()
        wait_until(eng.has_unfinished_requests, what="the request to reach the paused engine")
        assert eng.paused and eng.stats()["generation_tokens_total"] == before
    finally:
        eng.resume()
    t.join(DEADLINE_S)
    assert got[0].status_code == 200 and got[0].json()["usage"]["completion_tokens"] == 3
    model, tok = load_policy("tiny-llama")
    model.save_pretrained(tmp_path)
    assert eng.update_weights(str(tmp_path), 7) > 0 and eng.weight_version == 7
    with pytest.raises(ValueError, match="does not take 'step'"):
        loop.call("step")


def test_a_killed_engine_fails_its_requests_and_the_server_says_so(tmp_path):
    with running_server(tmp_path, max_model_len=4096) as (base, app):
        state = app.state.server
        pid = state.engine.pid
        long = {"messages": MSG, "max_tokens": 4000, "min_tokens": 4000, "ignore_eos": True}  # seconds of work: both still run
        got: dict = {}

        def unstreamed():
            got["plain"] = httpx.post(base + "/v1/chat/completions", json=long, timeout=DEADLINE_S)

        def streamed():
            c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            try:
                for _ in c.chat.completions.create(model="tiny-llama", messages=MSG, max_tokens=4000, stream=True,
                                                   extra_body={"min_tokens": 4000, "ignore_eos": True}):
                    pass
            except openai.APIError as e:
                got["stream"] = e

        ts = [threading.Thread(target=f) for f in (unstreamed, streamed)]
        for t in ts:
            t.start()
        wait_until(lambda: state.engine.stats()["num_requests_running"] == 2, what="both requests to run in the engine")
        os.kill(pid, signal.SIGKILL)
        for t in ts:
            t.join(DEADLINE_S)
        assert not any(t.is_alive() for t in ts), "a request hung after its engine died"
        assert got["plain"].status_code == 500 and "engine process exited (killed by SIGKILL)" in got["plain"].json()["error"]["message"]
        assert "engine process exited (killed by SIGKILL)" in str(got["stream"])
        health = httpx.get(base + "/health", timeout=30)
        assert health.status_code == 503 and "killed by SIGKILL" in health.json()["error"]
        assert httpx.get(base + "/ready", timeout=30).status_code == 503
        r = httpx.post(base + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_failed"
        assert state.loop.num_active == 0


@pytest.mark.slow  # ~19 s: two servers start; the engine process's own tests above run fast
def test_no_engine_process_outlives_its_server(tmp_path):
    """Stopped (SIGTERM): the engine exits with it. Killed (SIGKILL, no shutdown code runs): the
    engine gets the parent-death signal."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        port = free_port()
        proc = start_cli_server(port, "--model", "tiny-llama", "--dtype", "float32", "--jobs-db", str(tmp_path / f"{sig}.sqlite"),
                                "--job-workers", "0")
        try:
            wait_ready(f"http://127.0.0.1:{port}", DEADLINE_S, proc)
            kids = children(proc.pid)  # the engine, and multiprocessing's resource tracker
            assert [p for p, cmd in kids.items() if "spawn_main" in cmd and alive(p)], kids
            proc.send_signal(sig)
            proc.wait(DEADLINE_S)
            wait_until(lambda: not any(alive(p) for p in kids), what=f"the server's children to exit after its {sig.name}")
        finally:
            proc.kill()
            proc.wait(30)


def test_a_step_that_raises_fails_its_requests_and_the_engine_goes_on():
    """The engine's side on its own (in a thread here, on real pipes): the failed step's requests
    are named in one "failed" message with the error and its traceback; the next request runs."""
    model, tok = load_policy("tiny-llama")
    eng = LLMEngine(model, tokenizer=tok, num_kv_blocks=64)
    cmd_r, cmd_w = multiprocessing.Pipe(duplex=False)
    out_r, out_w = multiprocessing.Pipe(duplex=False)
    step = eng.step

    def broken():
        eng.step = step  # only this step breaks
        raise RuntimeError("boom")

    eng.step = broken
    core = Core(eng, cmd_r, out_w)
    serving = threading.Thread(target=core.serve, daemon=True)
    serving.start()
    params = SamplingParams(max_tokens=3, temperature=0)
    cmd_w.send(("add", 0, "a", [5, 6, 7], params))
    first, failed = out_r.recv(), out_r.recv()
    assert first[0] == "step" and first[1] == 0 and first[3] == []  # the add was applied; no step completed
    assert failed[0] == "failed" and failed[1] == [0] and str(failed[2]) == "boom" and "RuntimeError: boom" in failed[3]
    assert not eng.has_unfinished_requests()
    cmd_w.send(("add", 1, "b", [5, 6, 7], params))
    tokens = []
    while not tokens or tokens[-1][8] is None:
        msg = out_r.recv()
        assert msg[0] == "step" and [d[0] for d in msg[3]] == [1]
        tokens.append(msg[3][0])
    assert sum(len(d[2]) for d in tokens) == 3 and tokens[-1][8] == "length"
    cmd_w.send(("stop",))
    serving.join(DEADLINE_S)
    assert not serving.is_alive()
