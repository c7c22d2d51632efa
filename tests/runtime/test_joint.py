"""A joint multi-domain run of the tiny model (examples/tiny_joint.yaml): five domains share the
rollouts by weight, priority and budget, per-domain metrics are logged, resume is exact."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from longhaul.config import load_config
from longhaul.runtime.metrics import without_clock
from longhaul.runtime.online import run_training

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_joint.yaml"
QUIET = ["log.progress=false", "eval.before_after=false"]
DOMAINS = ["echo", "arith", "strings", "lists", "math"]


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _drawn(run: Path) -> list[str]:
    log = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    return [d for r in log if r["op"] == "submit" for d, _ in r["tasks"]]


def test_joint_run_logs_per_domain_metrics_and_follows_priority_budget_and_weights(tmp_path):
    result = run_training(load_config(EXAMPLE, [f"output_dir={tmp_path}", "log.progress=false"]))
    run = tmp_path / "tiny_joint"
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for name in DOMAINS:
        for key in ("episodes", "tokens", "sandbox_s", "draws"):
            assert all(f"domain/{name}/{key}" in r for r in rows), f"domain/{name}/{key}"
        for key in ("pass_rate", "reward"):  # present in the steps where the domain had episodes
            assert any(f"domain/{name}/{key}" in r for r in rows), f"domain/{name}/{key}"
    assert "<h2>Domains</h2>" in (run / "report.html").read_text()
    drawn = _drawn(run)
    # math has priority 1 and a budget of 8 episodes (two groups of 4): it takes the first two slots, then stops
    assert drawn[:2] == ["math", "math"] and drawn.count("math") == 2
    rest = drawn[2:]
    weights = {"echo": 2, "arith": 1, "strings": 1, "lists": 1}  # stride mixing: each share within one slot of its weight's
    for name, w in weights.items():
        assert abs(rest.count(name) - len(rest) * w / 5) <= 1, (name, rest)
    # the trainer saw the shaped reward (math: x2) while the scheduler recorded the verifier's
    log = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    for r in log:
        if r["op"] == "put":
            for t in r["group"]:
                scale = 2.0 if t["info"]["domain"] == "math" else 1.0
                assert t["reward"] == scale * t["info"]["raw_reward"]
    assert result["comparison"]["base"]["n"] == 10  # two held-out tasks from each of the five domains


def test_joint_run_resumes_two_plus_two_bit_for_bit(tmp_path):
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'a'}", *QUIET]))
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'b'}", *QUIET, "train.steps=2"]))
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'b'}", *QUIET]), resume=True)
    a, b = tmp_path / "a" / "tiny_joint", tmp_path / "b" / "tiny_joint"
    wa, wb = (load_file(r / "checkpoints" / "step_4" / "model.safetensors") for r in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [without_clock(r) for r in _rows(a)] == [without_clock(r) for r in _rows(b)]
    assert _drawn(a) == _drawn(b)


def test_joint_run_async(tmp_path):
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path}", *QUIET, "runtime.mode=async", "runtime.max_staleness=1",
                                       "runtime.worker_kind=thread"]))
    rows = _rows(tmp_path / "tiny_joint")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["staleness/max"] <= 1 for r in rows)
    assert sum(r["domain/echo/episodes"] for r in rows) > 0
