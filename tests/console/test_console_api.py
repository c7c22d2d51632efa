"""The console's API over a runs directory on disk: summaries and status, metrics read
incrementally (a corrupt line is a warning, a rewritten file a reset), config, evaluation,
episodes paged and filtered with every turn whole, and what it refuses: paths out of the runs
directory, deleted runs, calls without the token."""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from longhaul.cli import main  # noqa: E402
from longhaul.console.app import create_app, run_console  # noqa: E402
from longhaul.errors import LonghaulError  # noqa: E402
from longhaul.runtime.metrics import MetricsLog  # noqa: E402
from tests.console.runs_on_disk import LONG_OUTPUT, make_runs, write_metrics  # noqa: E402


@pytest.fixture
def root(tmp_path):
    return make_runs(tmp_path / "runs")


@pytest.fixture
def client(root):
    return TestClient(create_app(root))


def test_runs_list_infers_status_and_progress(client):
    runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert sorted(runs) == ["agent", "agent/rl", "agent/sft", "crashed", "grpo-tiny", "live"]
    assert {k: r["status"] for k, r in runs.items()} == {"agent": "finished", "agent/rl": "finished", "agent/sft": "finished",
                                                         "crashed": "failed", "grpo-tiny": "finished", "live": "running"}
    g = runs["grpo-tiny"]
    assert (g["algorithm"], g["model"], g["last_step"]) == ("grpo", "tiny-llama", 6)
    assert g["reward"] == pytest.approx(0.6) and g["pass_rate"] == pytest.approx(0.3) and g["started"] > 0
    assert g["episode_sources"] == ["buffer.jsonl"]
    assert runs["agent"]["algorithm"] == "pipeline" and runs["agent"]["pass_rate"] == pytest.approx(17 / 30)
    assert runs["agent"]["stages"] == ["agent/rl", "agent/sft"] and runs["agent/sft"]["algorithm"] == "sft"


def test_metrics_come_incrementally_and_a_corrupt_line_is_a_warning(client, root):
    first = client.get("/api/runs/grpo-tiny/metrics").json()
    assert [r["step"] for r in first["rows"]] == [1, 2, 3, 5, 6] and first["next"] == 6 and not first["more"]
    assert len(first["warnings"]) == 1 and "line 4" in first["warnings"][0] and "skipped" in first["warnings"][0]
    assert client.get("/api/runs/grpo-tiny/metrics?after=6").json()["rows"] == []

    write_metrics(root / "grpo-tiny", range(7, 9))
    with (root / "grpo-tiny" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 9, "rew')  # a line still being written is not served yet
    new = client.get("/api/runs/grpo-tiny/metrics?after=6").json()
    assert [r["step"] for r in new["rows"]] == [7, 8] and new["next"] == 8 and new["warnings"] == [] and not new["reset"]
    with (root / "grpo-tiny" / "metrics.jsonl").open("a") as f:
        f.write('ard": 0.9}\n')
    assert [r["reward"] for r in client.get("/api/runs/grpo-tiny/metrics?after=8").json()["rows"]] == [0.9]

    paged = client.get("/api/runs/grpo-tiny/metrics?after=0&limit=2").json()
    assert [r["step"] for r in paged["rows"]] == [1, 2] and paged["more"] and paged["next"] == 2


def test_a_diverged_metric_is_served_as_missing_with_a_warning(client, root):
    """Python's json writes NaN and Infinity (a loss that diverged); JSON has no such values, so
    they go out as null, the line's other values intact, and a warning names them."""
    with (root / "grpo-tiny" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "loss": NaN, "reward": 0.5, "kl": {"max": -Infinity}}\n')
    got = client.get("/api/runs/grpo-tiny/metrics?after=6")
    assert got.status_code == 200
    body = got.json()
    assert body["rows"] == [{"step": 7, "loss": None, "reward": 0.5, "kl": {"max": None}, "_line": 7}]
    assert body["warnings"] == ["metrics.jsonl line 7: not a finite number: loss (nan), kl.max (-inf); shown as missing"]


def test_metrics_as_columns_align_every_metric_with_the_steps(client, root):
    """The run page's format: one array per top-level number, null where a line lacks it; nested
    values (`kl.max`) and strings stay in the rows format only."""
    with (root / "grpo-tiny" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "loss": NaN, "reward": 0.5, "kl": {"max": -Infinity}, "note": "x", "new": 3}\n')
        f.write('{"reward": 0.25}\n')  # no step: its line number stands in
    body = client.get("/api/runs/grpo-tiny/metrics?format=columns").json()
    rows = client.get("/api/runs/grpo-tiny/metrics").json()["rows"]
    assert body["x"] == [1, 2, 3, 5, 6, 7, 8] and body["next"] == 8 and len(body["warnings"]) == 2
    assert body["columns"]["reward"] == [r.get("reward") for r in rows]
    assert body["columns"]["agent/turns"] == [r.get("agent/turns") for r in rows]
    assert body["columns"]["loss"] == [None] * 5 + [None, None]
    assert body["columns"]["new"] == [None] * 5 + [3, None]
    assert "kl" in body["columns"] and body["columns"]["kl"][5] is None  # the nested value is not a number here
    assert "note" not in body["columns"] and "step" not in body["columns"]
    tail = client.get("/api/runs/grpo-tiny/metrics?format=columns&after=6").json()
    assert tail["x"] == [7, 8] and tail["columns"]["new"] == [3, None] and set(tail["columns"]) >= {"reward", "loss"}
    bad = client.get("/api/runs/grpo-tiny/metrics?format=csv")
    assert bad.status_code == 400 and "format" in bad.json()["error"]


def test_an_episodes_audit_rows_come_from_the_runs_audit_log(client, root):
    e = client.get("/api/runs/grpo-tiny/episode", params={"source": "buffer.jsonl", "id": "1.0"}).json()
    sandbox = e["info"]["sandbox"]
    got = client.get("/api/runs/grpo-tiny/audit", params={"sandbox": sandbox}).json()
    argv = [r["argv"] for r in got["rows"]]
    assert argv[0] == ["bash", "-c", "mkdir -p src && echo 'TODO list: empty' > src/a.py"]
    assert ["session", "grep -rn TODO src"] in argv and ["bash", "-c", "test -d /work"] in argv
    assert all(r["sandbox"] == sandbox for r in got["rows"] if "episode" not in r)
    check = [r for r in got["rows"] if r.get("episode") == sandbox]
    assert len(check) == 1 and check[0]["sandbox"] != sandbox and check[0]["exit_code"] == 0
    assert [r["exit_code"] for r in got["rows"] if r["argv"] == ["session", "exit 3"]] == [3]
    assert ["true"] not in argv  # another sandbox's command
    # a line appended later (a run still writing) is picked up; a corrupt one is a warning
    with (root / "grpo-tiny" / "audit.jsonl").open("a") as f:
        f.write('{"sandbox": "%s", "argv": ["session", "ls"], "exit_code": 0}\n{"sandbox": \n' % sandbox)
    again = client.get("/api/runs/grpo-tiny/audit", params={"sandbox": sandbox}).json()
    assert again["rows"][-1]["argv"] == ["session", "ls"] and len(again["rows"]) == len(got["rows"]) + 1
    assert len(again["warnings"]) == 1 and "audit.jsonl line" in again["warnings"][0]

    bad = client.get("/api/runs/grpo-tiny/audit", params={"sandbox": "../x"})
    assert bad.status_code == 400 and "not a sandbox id" in bad.json()["error"]
    none = client.get("/api/runs/live/audit", params={"sandbox": sandbox})
    assert none.status_code == 404 and "no audit log" in none.json()["error"]
    assert client.get("/api/runs/grpo-tiny/audit", params={"sandbox": "abcdef123456"}).json()["rows"] == []


def test_a_team_episode_opens_whole_in_the_order_of_its_turns(client, root):
    import json

    from longhaul.runtime.team_train import episode_rows
    from tests.team_episodes import coder_tester_episode

    team = root / "team"
    team.mkdir()
    (team / "team_train_config.json").write_text(json.dumps({"name": "team", "model": {"name": "tiny-llama"}}))
    rows = [r for key in ("e0", "e1") for r in episode_rows(coder_tester_episode(key, fix=key == "e1")[1])]
    assert rows[1]["task_id"] == rows[2]["task_id"]  # two episodes of one task, two rows each: told apart by episode
    (team / "episodes_rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = next(r for r in client.get("/api/runs").json()["runs"] if r["name"] == "team")
    assert summary["algorithm"] == "team" and summary["model"] == "tiny-llama" and summary["episode_sources"] == ["episodes_rl.jsonl"]
    page = client.get("/api/runs/team/episodes", params={"source": "episodes_rl.jsonl", "turns": "false"}).json()
    assert [(e["id"], e["role"], e["passed"]) for e in page["episodes"]] == [
        ("1.0", "tester", False), ("2.0", "coder", False), ("3.0", "tester", True), ("4.0", "coder", True)]
    for ident in ("3.0", "4.0"):  # either role's row opens the same whole episode
        e = client.get("/api/runs/team/episode", params={"source": "episodes_rl.jsonl", "id": ident}).json()
        marks = [(t["content"], t["actor"]) for t in e["turns"] if t["role"] == "team"]
        assert marks == [("turn 1: tester (yield)", "tester"), ("turn 2: coder (submit)", "coder")]
        assert e["turns"][0]["role"] == "user" and "scheduler" in e["turns"][0]["content"]  # the task, once
        acted = [(t["actor"], t["role"]) for t in e["turns"][1:] if t["role"] != "team"]
        assert acted[:4] == [("tester", "assistant"), ("tester", "tool")] * 2 and acted[4] == ("coder", "user")
        assert [c["name"] for t in e["turns"] if t.get("actor") == "coder" for c in t.get("tool_calls", [])] == [
            "apply_patch", "run_tests", "submit"]
    first = client.get("/api/runs/team/episode", params={"source": "episodes_rl.jsonl", "id": "2.0"}).json()
    assert [t["content"] for t in first["turns"] if t["role"] == "team"] == ["turn 1: tester (yield)", "turn 2: coder (submit)"]
    assert [c["name"] for t in first["turns"] if t.get("actor") == "coder" for c in t.get("tool_calls", [])] == ["submit"]


def test_a_rewritten_metrics_file_resets_the_reader(client, root):
    assert client.get("/api/runs/live/metrics").json()["next"] == 2
    assert client.get("/api/runs/live/metrics?format=columns").json()["x"] == [1, 2]
    MetricsLog(root / "live", resume_step=1)  # a resume drops the steps it will redo
    got = client.get("/api/runs/live/metrics?after=2").json()
    assert got["reset"] and [r["step"] for r in got["rows"]] == [1]
    # the rows reader saw the reset first; the columns kept in memory start over all the same
    cols = client.get("/api/runs/live/metrics?format=columns&after=2").json()
    assert cols["reset"] and cols["x"] == [1] and cols["columns"]["reward"] == [pytest.approx(0.1)]
    write_metrics(root / "live", range(2, 4))
    grown = client.get("/api/runs/live/metrics?format=columns&after=1").json()
    assert not grown["reset"] and grown["x"] == [2, 3] and grown["next"] == 3


def test_config_and_evaluation_tables(client):
    cfg = client.get("/api/runs/grpo-tiny/config").json()
    assert cfg["file"] == "config.yaml" and "name: grpo-tiny" in cfg["text"] and cfg["config"]["algo"]["name"] == "grpo"
    assert client.get("/api/runs/agent/config").json()["file"] == "pipeline_config.json"

    rows = {r["stage"]: r for r in client.get("/api/runs/grpo-tiny/eval").json()["rows"]}
    assert (rows["base"]["passed"], rows["base"]["n"], rows["trained"]["pass_rate"]) == (1, 4, 0.75)
    ev = client.get("/api/runs/agent/eval").json()
    assert [(r["stage"], r["set"], r["passed"]) for r in ev["rows"]][:3] == [("base", "trained sets", 10), ("sft", "trained sets", 14),
                                                                             ("rl", "trained sets", 17)]
    assert ev["tests"][0]["name"] == "sft_vs_base" and ev["tests"][0]["p_value"] == 0.22
    assert client.get("/api/runs/crashed/eval").json()["rows"] == []


def test_transcripts_are_paged_filtered_and_whole(client):
    url = "/api/runs/agent/episodes?source=episodes_base.jsonl"
    page = client.get(url + "&limit=5&offset=5").json()
    assert page["total"] == 30 and [e["task_id"] for e in page["episodes"]] == [f"terminal/grep_files/{i}" for i in range(5, 10)]
    assert client.get(url + "&result=pass").json()["total"] == 10
    assert client.get(url + "&result=fail&task=GREP_FILES/2").json()["total"] == 8  # 2, 20..29 less 21, 24, 27
    turns = page["episodes"][0]["turns"]
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert turns[3]["content"] == LONG_OUTPUT and len(LONG_OUTPUT) > 2000
    assert turns[2]["tool_calls"] == [{"name": "run", "arguments": {"cmd": "grep -rn TODO src"}, "error": None}]
    assert "turns" not in client.get(url + "&turns=false").json()["episodes"][0]
    assert client.get(url + "&result=maybe").status_code == 400


def test_buffer_trajectories_are_decoded_turn_by_turn(client):
    url = "/api/runs/grpo-tiny/episodes?source=buffer.jsonl"
    page = client.get(url).json()
    assert page["total"] == 4 and [e["id"] for e in page["episodes"]] == ["1.0", "1.1", "3.0", "3.1"]
    assert client.get(url + "&step=2&result=fail").json()["total"] == 1
    ep = client.get("/api/runs/grpo-tiny/episode?source=buffer.jsonl&id=3.1").json()
    assert (ep["step"], ep["passed"], ep["reward"]) == (2, False, 0.0)
    roles = [t["role"] for t in ep["turns"]]
    assert roles == ["prompt", "assistant", "tool", "assistant"]
    assert ep["turns"][0]["content"].startswith("<|im_start|>user\nFind the TODOs.")
    assert LONG_OUTPUT in ep["turns"][2]["content"]
    assert [c["name"] for c in ep["turns"][3]["tool_calls"]] == ["submit"] and ep["turns"][3]["reward"] == 0.25
    assert client.get("/api/runs/grpo-tiny/episode?source=buffer.jsonl&id=9.9").status_code == 404


def test_paths_out_of_the_runs_directory_are_refused(client, root, tmp_path):
    for bad in ("%2E%2E", "grpo-tiny/%2E%2E/%2E%2E", "%2Fetc", "grpo-tiny/%2E/x"):
        r = client.get(f"/api/runs/{bad}/summary")
        assert r.status_code == 400 and "not a path inside the runs directory" in r.json()["error"], bad
    r = client.get("/api/runs/grpo-tiny/episodes?source=../../../etc/passwd")
    assert r.status_code == 404 and "buffer.jsonl" in r.json()["error"]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_metrics(outside, range(1, 3))
    os.symlink(outside, root / "escape")
    (root / "crashed" / "metrics.jsonl").unlink()
    os.symlink(outside / "metrics.jsonl", root / "crashed" / "metrics.jsonl")
    assert "escape" not in [r["name"] for r in client.get("/api/runs").json()["runs"]]
    assert client.get("/api/runs/escape/metrics").status_code == 404
    assert client.get("/api/runs/crashed/metrics").json()["rows"] == []  # a symlink out reads as no file
    assert client.get("/static/../../paths.py").status_code == 404
    assert "def create_app" not in client.get("/run?page=../app.py").text  # pages take no file name from the request
    bad = client.get("/api/runs/grpo-tiny/episodes?source=buffer.jsonl&step=two")
    assert bad.status_code == 400 and bad.json()["error"].startswith("step:")
    assert client.get("/api/nothing/here").status_code == 404


def test_a_run_deleted_while_open_is_a_clear_404(client, root):
    assert client.get("/api/runs/live/metrics").status_code == 200
    shutil.rmtree(root / "live")
    for what in ("summary", "metrics?after=2", "config", "eval"):
        r = client.get(f"/api/runs/live/{what}")
        assert r.status_code == 404 and "deleted" in r.json()["error"], what
    assert "live" not in [r["name"] for r in client.get("/api/runs").json()["runs"]]


def test_a_token_guards_every_api_call(root, monkeypatch, capsys):
    client = TestClient(create_app(root, token="s3cret"))
    for url in ("/api/runs", "/api/runs/grpo-tiny/metrics", "/api/runs/agent/episode?source=episodes_base.jsonl&id=1.0"):
        r = client.get(url)
        assert r.status_code == 401 and "token" in r.json()["error"], url
        assert client.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/").status_code == 200  # the page holds no run data

    monkeypatch.delenv("LONGHAUL_CONSOLE_TOKEN", raising=False)
    with pytest.raises(LonghaulError, match="--token"):
        run_console(root, host="0.0.0.0")
    with pytest.raises(SystemExit) as e:
        main(["console", "--runs", str(root), "--host", "192.168.1.7"])
    assert e.value.code == 2 and "--token" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["console", "--runs", str(root / "missing")])
    assert "pass --runs DIR" in capsys.readouterr().err


def test_environments_list_the_manifest_with_each_family_current_or_stale(root, tmp_path):
    from tests.console.runs_on_disk import FAILING_REASON, make_manifest

    manifest = make_manifest(tmp_path / "envcheck" / "manifest.json")
    body = TestClient(create_app(root, manifest=manifest)).get("/api/environments").json()
    fams = {f["family"]: f for f in body["families"]}
    assert list(fams) == ["funcgen", "multistep", "retired"] and body["manifest"] == str(manifest)
    assert {k: f["currency"] for k, f in fams.items()} == {"funcgen": "current", "multistep": "stale", "retired": "unknown family"}
    assert fams["funcgen"]["reasons"]["funcgen/v1/bad"] == FAILING_REASON and fams["funcgen"]["flaky"] == ["funcgen/v1/shaky"]


def test_environments_before_any_check_and_with_a_corrupt_manifest(root, tmp_path):
    missing = TestClient(create_app(root, manifest=tmp_path / "none.json")).get("/api/environments")
    assert missing.status_code == 200 and missing.json()["families"] == [] and "longhaul envcheck" in missing.json()["note"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"families": {"funcgen": ')
    r = TestClient(create_app(root, manifest=bad)).get("/api/environments")
    assert r.status_code == 422 and "not valid JSON" in r.json()["error"] and "longhaul envcheck" in r.json()["error"]
    bad.write_text('{"families": {"funcgen": 3}}')
    r = TestClient(create_app(root, manifest=bad)).get("/api/environments")
    assert r.status_code == 200 and r.json()["families"] == [] and "funcgen" in r.json()["warnings"][0]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`longhaul serve`'s app with tiny-llama, on loopback: its base URL."""
    from tests.serve.conftest import running_server

    with running_server(tmp_path_factory.mktemp("serve")) as (base, _):
        yield base


def _events(text: str) -> list[str]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def test_playground_lists_the_models_and_streams_a_chat_through_the_console(root, served):
    import json

    client = TestClient(create_app(root, serve=served))
    listing = client.get("/api/playground").json()
    assert listing["server"] == served and "tiny-llama" in listing["models"]
    r = client.post("/api/playground/chat", json={"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = _events(r.text)
    assert data[-1] == "[DONE]" and len(data) >= 3  # streamed: a chunk per delta, not one answer
    deltas = [json.loads(d)["choices"][0]["delta"] for d in data[:-1] if json.loads(d)["choices"]]
    assert "".join(d.get("content") or "" for d in deltas)


def test_playground_errors_name_the_fix(root, served):
    none = TestClient(create_app(root)).get("/api/playground")
    assert none.status_code == 503 and "--serve URL" in none.json()["error"]
    gone = TestClient(create_app(root, serve="http://127.0.0.1:9")).get("/api/playground")
    assert gone.status_code == 502 and "did not answer" in gone.json()["error"]
    client = TestClient(create_app(root, serve=served))
    assert client.post("/api/playground/chat", json={"model": "tiny-llama"}).status_code == 400
    odd = client.post("/api/playground/chat", json={"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "n": 3})
    assert odd.status_code == 400 and "'n'" in odd.json()["error"]
    wrong = client.post("/api/playground/chat", json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert 400 <= wrong.status_code < 500 and "the server refused the chat" in wrong.json()["error"], wrong.json()


def test_console_cli_refuses_a_serve_address_that_is_not_a_url(root, capsys):
    with pytest.raises(SystemExit) as e:
        main(["console", "--runs", str(root), "--serve", "localhost:8000"])
    assert e.value.code != 0 and "is not an http(s) URL" in capsys.readouterr().err
