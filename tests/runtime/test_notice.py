"""The stop notice: SIGTERM (or SIGUSR1) during a run finishes the step, saves a checkpoint, exits
143 with one line, and --resume from there ends on the weights of the run never stopped."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longhaul.config import load_config
from longhaul.runtime import train
from longhaul.runtime.metrics import MetricsLog, without_clock
from longhaul.runtime.notice import StopNotice, StopRequested

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_grpo.yaml"
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.before_after=false"]  # as the tiny_grpo_run fixture


def _signal_after_step(monkeypatch, step: int, sig=signal.SIGTERM) -> None:
    """Send `sig` to this process just after the loop logs `step` (both loops log once a step)."""
    write = MetricsLog.write

    def write_then_signal(self, s, metrics):
        write(self, s, metrics)
        if s == step:
            os.kill(os.getpid(), sig)

    monkeypatch.setattr(MetricsLog, "write", write_then_signal)


def _weights(run: Path, step: int) -> dict:
    return load_file(run / "checkpoints" / f"step_{step}" / "model.safetensors")


def test_grpo_stopped_by_sigterm_saves_and_resumes_to_the_same_weights(tmp_path, monkeypatch, tiny_grpo_run):
    before = signal.getsignal(signal.SIGTERM)
    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", *QUIET])
    _signal_after_step(monkeypatch, 1)
    with pytest.raises(StopRequested) as stop:
        train(cfg)
    assert stop.value.exit_code == 143
    assert str(stop.value).startswith("SIGTERM received: stopped after step 1 of 4 with its checkpoint at ")
    run = tmp_path / "tiny_grpo"
    assert (run / "checkpoints" / "step_1" / "trainer_state.pt").is_file()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is gone with the run
    monkeypatch.undo()

    train(cfg, resume=True)
    want, got = _weights(tiny_grpo_run, 4), _weights(run, 4)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    rows = lambda r: [without_clock(json.loads(line)) for line in (r / "metrics.jsonl").read_text().splitlines()]
    assert rows(run) == rows(tiny_grpo_run)


def test_sft_stopped_by_sigusr1_saves_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    rows = tmp_path / "sft.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": w}]}) + "\n"
                            for i, w in enumerate(["apple", "river", "stone", "cloud", "amber", "maple", "cedar", "delta"])))
    cfg = lambda out: load_config(None, [f"output_dir={out}", "name=sft", "model.name=tiny-llama", "algo.name=sft", f"data.path={rows}",
                                         "data.batch_size=2", "data.heldout_fraction=0.25", "train.steps=3", "train.save_every=0",
                                         "train.lr=1e-3", "train.autocast=none", "log.progress=false", "log.tensorboard=false"])
    train(cfg(tmp_path / "a"))
    _signal_after_step(monkeypatch, 2, signal.SIGUSR1)
    with pytest.raises(StopRequested, match=r"^SIGUSR1 received: stopped after step 2 of 3"):
        train(cfg(tmp_path / "b"))
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "b" / "sft" / "checkpoints").iterdir()] == ["step_2"]
    train(cfg(tmp_path / "b"), resume=True)
    a, b = _weights(tmp_path / "a" / "sft", 3), _weights(tmp_path / "b" / "sft", 3)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_notice_outside_the_main_thread_installs_nothing():
    import threading

    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def run():
        with StopNotice() as notice:
            seen.append((signal.getsignal(signal.SIGTERM), notice.received))

    th = threading.Thread(target=run)
    th.start()
    th.join()
    assert seen == [(before, None)]


def test_the_cli_stops_on_sigterm_with_one_line_and_exit_143(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "longhaul.cli", "train", str(EXAMPLE), f"output_dir={tmp_path}", "train.steps=500",
           "train.save_every=0", *QUIET]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics = tmp_path / "tiny_grpo" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stopped: SIGTERM received: stopped after step "), err
    assert "Traceback" not in out + err
    step = int(lines[0].split("after step ")[1].split()[0])
    assert 1 <= step < 500
    assert [p.name for p in (tmp_path / "tiny_grpo" / "checkpoints").iterdir()] == [f"step_{step}"]
    assert json.loads(metrics.read_text().splitlines()[-1])["step"] == step


def test_deliver_reaches_every_open_notice_and_only_those():
    assert StopNotice.deliver("SIGTERM") == 0  # none open: nobody hears it
    with StopNotice() as a, StopNotice() as b:
        assert StopNotice.deliver("SIGUSR1") == 2
        StopNotice.deliver("SIGTERM")
        assert a.received == b.received == "SIGUSR1"  # the first one counts
    fresh = StopNotice()
    with fresh:
        assert fresh.received is None
