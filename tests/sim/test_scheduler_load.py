"""benchmarks/scheduler_load.py: real (small) simulator runs at two loads, gathered by the load
each draw offers; bad input gets one error line and a non-zero exit, and nothing written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--nodes", "20", "--racks", "2", "--domains", "6", "--hours", "4", "--warmup", "1", "--policies", "longhaul,fifo"]


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("sim")
    paths = []
    for load in ("0.9", "0.5"):  # the heavier first: the gatherer orders them
        p = out / f"sim_{load}.json"
        done = _run("scheduler_sim.py", *SMALL, "--load", load, "--out", str(p))
        assert done.returncode == 0, done.stderr
        paths.append(p)
    return paths


@pytest.mark.slow  # ~12 s: two simulator runs in subprocesses
def test_runs_are_gathered_by_the_load_their_draw_offers(runs, tmp_path):
    sims = [json.loads(p.read_text()) for p in runs]
    for sim in sims:  # the simulator records the draw's load: its GPU-hours of work over the GPUs x hours
        w = sim["workload"]
        assert w["offered_gpu_load"] == pytest.approx(w["offered_gpu_hours"] / (w["gpus"] * sim["spec"]["hours"]), rel=1e-12)
    out = tmp_path / "load.json"
    done = _run("scheduler_load.py", *map(str, runs), "--out", str(out))
    assert done.returncode == 0, done.stderr
    got = json.loads(out.read_text())["runs"]
    assert [r["load"] for r in got] == [0.5, 0.9]
    assert got[0]["offered_gpu_load"] < got[1]["offered_gpu_load"]
    for r, sim in zip(got, reversed(sims)):
        ours, fifo = sim["results"]["longhaul"], sim["results"]["fifo"]
        assert (r["fairness_error_policy"], r["fairness_error_1h_policy"], r["delay_p99_s_baseline"]) == (
            ours["fairness_error"], ours["fairness_error_1h"], fifo["delay_p99_s"])
        assert r["goal"] == sim["goal"]  # the same verdict the simulator recorded
        assert r["goal_met"] == (sim["goal"]["fairness_within_5pct"] and sim["goal"]["lower_p99_delay"]
                                 and sim["goal"]["higher_gpu_utilisation_backlogged"])
    page = out.with_suffix(".html").read_text()
    assert page.count("<svg") == 3 and "fairness error by offered load" in page


@pytest.mark.slow  # ~13 s of benchmark-script subprocesses
def test_bad_input_gets_one_error_line_and_writes_nothing(runs, tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text('{"not": "a run"}')
    out = tmp_path / "load.json"
    for args, says in (([str(tmp_path / "missing.json")], "does not exist"), ([str(junk)], "is not a scheduler_sim.py result"),
                       ([str(runs[0]), "--baseline", "fifo_backfill"], "has no 'longhaul' or 'fifo_backfill' run")):
        done = _run("scheduler_load.py", *args, "--out", str(out))
        assert done.returncode != 0 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not out.exists() and not out.with_suffix(".html").exists()
