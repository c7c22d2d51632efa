"""log.report_to: one tiny GRPO run reports to MLflow, W&B (offline) and Trackio at once, and each
test reads back from that tracker's own store (MLflow's SQLite store, the offline `.wandb` log and
its table files, Trackio's SQLite store) what metrics.jsonl and config.yaml hold. No tracker is mocked."""

import json
import struct
import sys
import zlib
from pathlib import Path

import pytest
import yaml

from longhaul.config import load_config
from longhaul.errors import LonghaulError
from longhaul.runtime.metrics import read_metrics
from longhaul.runtime.trackers import TABLE_COLUMNS, TRACKERS, flat_config, tracker_scalars

# the trackers extra (make test installs it); found here, imported by the runs themselves
pytestmark = pytest.mark.skipif(TRACKERS["mlflow"].missing() or TRACKERS["wandb"].missing() or TRACKERS["trackio"].missing(),
                                reason="pip install 'longhaul[trackers]'")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_grpo.yaml"
QUIET = ["log.progress=false", "eval.before_after=false"]
STEPS, TABLES_EVERY = 3, 2  # steps 1..3, one table at step 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    import torch

    from longhaul.runtime.online import run_training

    out = tmp_path_factory.mktemp("trackers")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_training(load_config(EXAMPLE, [f"output_dir={out}", *QUIET, "log.report_to=[mlflow, wandb, trackio]",
                                           f"log.tables_every={TABLES_EVERY}", f"train.steps={STEPS}", "train.save_every=0"]))
    finally:
        torch.set_num_threads(before)
    return out / "tiny_grpo"


def _expected(run_dir: Path) -> tuple[dict[int, dict], dict]:
    """What the trackers must show: each step's scalars (tracker names) and the resolved config."""
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return {r["step"]: tracker_scalars(r) for r in rows}, yaml.safe_load((run_dir / "config.yaml").read_text())


def _same_series(got: dict[int, dict], want: dict[int, dict]) -> None:
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for step, scalars in want.items():
        # every scalar of every step, TRL's names among them; exact: each store keeps float64
        assert {"reward", "kl", "learning_rate", "completions/mean_length", "grad_norm"} <= scalars.keys()
        diff = {k: (v, got[step].get(k)) for k, v in scalars.items() if got[step].get(k) != v}
        assert not diff, f"step {step}: (metrics.jsonl, tracker) differ: {diff}"


def _check_table(rows: list[dict], want: dict) -> None:
    """The step-2 table: every sampled episode, its rewards and passes those metrics.jsonl averaged."""
    assert len(rows) == 2 * 4 and all(r["step"] == TABLES_EVERY for r in rows)  # prompts_per_step x group_size
    assert all(isinstance(r["prompt"], str) and r["prompt"] and isinstance(r["completion"], str) for r in rows), rows[0]
    mean = sum(r["reward"] for r in rows) / len(rows)
    assert abs(mean - want["reward"]) < 1e-9, (mean, want["reward"])
    assert sum(bool(r["passed"]) for r in rows) / len(rows) == want["pass_rate"]


def test_mlflow_sqlite_store_holds_scalars_params_and_table(run_dir):
    from mlflow import MlflowClient

    want, config = _expected(run_dir)
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("longhaul").experiment_id])
    assert run.info.run_name == "tiny_grpo" and run.info.status == "FINISHED"
    got: dict[int, dict] = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(run.info.run_id, key):
            got.setdefault(m.step, {})[key] = m.value
    _same_series(got, want)
    params = run.data.params
    assert params == {k: v[:6000] for k, v in flat_config(config).items()}
    assert params["train.lr"] == "0.001" and params["log.report_to"] == '["mlflow", "wandb", "trackio"]'
    path = client.download_artifacts(run.info.run_id, f"rollouts/step_{TABLES_EVERY}.json", str(run_dir.parent / "mlflow_dl"))
    table = json.loads(Path(path).read_text())
    assert table["columns"] == list(TABLE_COLUMNS)
    _check_table([dict(zip(table["columns"], r)) for r in table["data"]], want[TABLES_EVERY])


def _wandb_records(path: Path):
    """The protobuf records of an offline `.wandb` file: W&B's leveldb-style log (a 7-byte header
    ":W&B", 0xBEE1, version 0; then 32 KiB blocks of chunks, each crc32 / length / kind (1 full,
    2 first, 3 middle, 4 last) and data), parsed with W&B's own Record message."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind == 0:
            continue
        assert crc == zlib.crc32(chunk, zlib.crc32(bytes([kind]))), f"bad checksum at byte {pos}"
        parts += chunk
        if kind in (1, 4):
            rec = Record()
            rec.ParseFromString(parts)
            parts = b""
            yield rec


def test_wandb_offline_run_holds_scalars_config_and_table(run_dir):
    want, config = _expected(run_dir)
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    (log,) = offline.glob("run-*.wandb")
    got, tables, seen_config = {}, {}, {}
    for rec in _wandb_records(log):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            assert rec.run.display_name == "tiny_grpo" and rec.run.project == "longhaul"
            seen_config.update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "config":
            seen_config.update({u.key: json.loads(u.value_json) for u in rec.config.update})
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            step = items.pop("_step")
            if "rollouts/path" in items:
                tables[step] = items["rollouts/path"]
            got.setdefault(step, {}).update({k: v for k, v in items.items() if not k.startswith(("_", "rollouts/"))})
    _same_series(got, want)
    assert {k: v for k, v in seen_config.items() if k != "_wandb"} == config
    assert list(tables) == [TABLES_EVERY]
    table = json.loads((offline / "files" / tables[TABLES_EVERY]).read_text())
    assert table["columns"] == list(TABLE_COLUMNS)
    _check_table([dict(zip(table["columns"], r)) for r in table["data"]], want[TABLES_EVERY])


def test_trackio_local_store_holds_scalars_config_and_table(run_dir):
    from trackio.sqlite_storage import SQLiteStorage

    assert (run_dir / "trackio" / "longhaul.db").is_file()
    want, config = _expected(run_dir)
    assert SQLiteStorage.get_runs("longhaul") == ["tiny_grpo"]
    got, tables = {}, {}
    for entry in SQLiteStorage.get_logs("longhaul", "tiny_grpo"):
        step = entry.pop("step")
        entry.pop("timestamp")
        if "rollouts" in entry:
            tables[step] = entry.pop("rollouts")
        got.setdefault(step, {}).update(entry)
    _same_series(got, want)
    stored = SQLiteStorage.get_run_config("longhaul", "tiny_grpo")
    assert {k: v for k, v in stored.items() if not k.startswith("_")} == config
    assert list(tables) == [TABLES_EVERY] and tables[TABLES_EVERY]["_type"] == "trackio.table"
    _check_table(tables[TABLES_EVERY]["_value"], want[TABLES_EVERY])


def test_unknown_tracker_is_refused_at_config_load():
    with pytest.raises(LonghaulError) as e:
        load_config(EXAMPLE, ["log.report_to=[tensorboard, mlfow]"])
    msg = str(e.value)
    assert "\n" not in msg and "unknown tracker 'mlfow'" in msg and "did you mean mlflow?" in msg, msg


def test_missing_tracker_package_refuses_the_run_before_its_directory(tmp_path, monkeypatch):
    from longhaul.runtime.online import run_training

    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package that is not there: import fails
    with pytest.raises(LonghaulError) as e:
        run_training(load_config(EXAMPLE, [f"output_dir={tmp_path}", *QUIET, "log.report_to=[wandb]"]))
    msg = str(e.value)
    assert "\n" not in msg and "pip install 'longhaul[trackers]'" in msg and "log.report_to names wandb" in msg, msg
    assert not (tmp_path / "tiny_grpo").exists()


def test_tensorboard_key_is_an_alias_of_report_to():
    assert load_config(EXAMPLE, ["log.tensorboard=false"]).log.report_to == []
    assert load_config(EXAMPLE, ["log.report_to=[wandb]", "log.tensorboard=true"]).log.report_to == ["wandb", "tensorboard"]
    assert load_config(None, ["log.tensorboard=true"]).log.report_to is None  # the default: tensorboard when installed


def test_a_multi_turn_episode_goes_whole_into_one_table_row():
    """Two turns of one segment: the row's completion holds both replies and the tool output between them."""
    from longhaul.models.byte_tokenizer import byte_tokenizer
    from longhaul.runtime.metrics import rollout_rows
    from longhaul.types import Trajectory, Turn

    tok = byte_tokenizer()
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    prompt, reply1, tool, reply2 = enc("task: list files\n"), enc("ls"), enc("\n" + "x" * 3000 + "\n"), enc("submit")
    turn = lambda p, c: Turn(p, c, [0.0] * len(c), [0] * len(c), [1] * len(c))
    traj = Trajectory([turn(prompt, reply1), turn(prompt + reply1 + tool, reply2)], reward=1.0, group=0,
                      info={"task_id": "t/1", "passed": True})
    (row,) = rollout_rows(5, [[traj]], tok)
    assert row["prompt"] == "task: list files\n" and row["task"] == "t/1" and row["passed"] is True and row["step"] == 5
    assert row["completion"] == "[assistant]\nls\n\n[tool]\n\n" + "x" * 3000 + "\n\n\n[assistant]\nsubmit", row["completion"][:80]


def test_runs_one_after_another_in_one_process_each_log_to_their_own_trackio_store(tmp_path):
    """Trackio keeps its directory in module globals read at import (transformers may import it
    first, under another TRACKIO_DIR): each run's tracker points them at its own store."""
    from trackio.sqlite_storage import SQLiteStorage

    from longhaul.runtime.trackers import Trackio

    for name in ("first", "second"):
        t = Trackio(tmp_path / name, "longhaul", name, {"seed": 0})
        t.log_scalars(1, {"reward": 0.5})
        t.close()
        assert (tmp_path / name / "trackio" / "longhaul.db").is_file()
        assert SQLiteStorage.get_runs("longhaul") == [name]  # read from this run's store only


@pytest.mark.slow  # ~13 s: four trackers opened twice; the plain run's tests above stay fast
def test_a_resumed_run_continues_each_trackers_run(tmp_path):
    """`--resume` from step 2 after step 3 was logged: every tracker goes on with the run it began
    (one MLflow run, one W&B id, one Trackio run, one TensorBoard log whose step 3 is the redone
    one), each read back from its own store."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from trackio.sqlite_storage import SQLiteStorage

    from longhaul.runtime.trackers import open_trackers

    names = ["tensorboard", "mlflow", "wandb", "trackio"]
    for resume, steps in ((None, (1, 2, 3)), (2, (3, 4))):
        trackers = open_trackers(names, tmp_path, "longhaul", "resumed", {"seed": 0}, resume_step=resume)
        for s in steps:
            for t in trackers:
                t.log_scalars(s, {"reward": s + (0.5 if resume else 0.0)})
        for t in trackers:
            t.close()

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward")] == [(1, 1.0), (2, 2.0), (3, 3.5), (4, 4.5)]

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("longhaul").experiment_id])
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward"))
    assert history == [(1, 1.0), (2, 2.0), (3, 3.0), (3, 3.5), (4, 4.5)] and run.info.status == "FINISHED"

    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in runs}) == 1  # two sessions of one run id
    resumed = {}
    for rec in _wandb_records(next(runs[1].glob("run-*.wandb"))):
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            if "reward" in items:
                resumed[items["_step"]] = items["reward"]
    assert resumed == {3: 3.5, 4: 4.5}

    assert SQLiteStorage.get_runs("longhaul") == ["resumed"]
    logged = {}
    for entry in SQLiteStorage.get_logs("longhaul", "resumed"):
        logged.setdefault(entry["step"], []).append(entry["reward"])
    assert logged[4] == [4.5] and logged[3][-1] == 3.5 and logged[1] == [1.0]
