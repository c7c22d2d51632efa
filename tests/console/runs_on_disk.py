"""A runs directory with the files real runs leave, written by the writers runs use where they
are light (MetricsLog, ReplayBuffer entries, EvalResult, dump_config): a finished GRPO run with a
replay log, a pipeline with its stages, evaluations and transcripts, a run that stopped without
its report, and one still writing."""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from pathlib import Path

from longhaul.config import PipelineConfig, RunConfig, dump_config
from longhaul.eval.passrate import EvalResult
from longhaul.models.byte_tokenizer import byte_tokenizer
from longhaul.runtime.buffer import Entry
from longhaul.runtime.metrics import MetricsLog
from longhaul.sandbox import Sandbox, SandboxSpec
from longhaul.types import Trajectory, Turn

# a tool output far longer than any preview: 120 numbered lines and a marker at its very end
LONG_OUTPUT = "".join(f"line {i:04d}: {'abcdefghij' * 4}\n" for i in range(120)) + "END-OF-LONG-OUTPUT"
CALL = '<tool_call>\n{"name": "run", "arguments": {"cmd": "grep -rn TODO src"}}\n</tool_call>'
SUBMIT = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'


def write_metrics(d: Path, steps: range) -> None:
    log = MetricsLog(d)
    for s in steps:
        log.write(s, {"reward": 0.1 * s, "pass_rate": 0.05 * s, "kl": 0.01 / s, "agent/turns": 2.0 + s % 3, "step_time": 1.5})
    log.close()


def audited_episode(path: Path) -> str:
    """An episode's commands in a real sandbox audited to `path` (set-up, its shell session, a
    check in a fresh sandbox that names it), plus another sandbox's; the episode's sandbox id.
    The sandboxes run once a session; later calls copy that log."""
    text, sandbox = _audit_log()
    path.write_text(text)
    return sandbox


@functools.lru_cache(maxsize=1)
def _audit_log() -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "audit.jsonl"
        sandbox = _run_audited(path)
        return path.read_text(), sandbox


def _run_audited(path: Path) -> str:
    with Sandbox(SandboxSpec(), audit=path) as sb:
        sb.exec(["bash", "-c", "mkdir -p src && echo 'TODO list: empty' > src/a.py"])
        s = sb.open_session()
        s.run("grep -rn TODO src")
        s.run("exit 3")
        s.close()
        with Sandbox(SandboxSpec(), audit=path, episode=sb.id) as check:
            check.exec(["bash", "-c", "test -d /work"])
    with Sandbox(SandboxSpec(), audit=path) as other:
        other.exec(["true"])
    return sb.id


def _trajectory(tok, passed: bool, sandbox: str | None = None) -> Trajectory:
    """Two turns of one segment: the call, the tool's long output, then the submit."""
    enc = lambda text: tok.encode(text, add_special_tokens=False)
    prompt = enc("<|im_start|>user\nFind the TODOs.<|im_end|>\n<|im_start|>assistant\n")
    first, glue, second = enc(CALL), enc("<|im_end|>\n<|im_start|>tool\n" + LONG_OUTPUT + "<|im_end|>\n<|im_start|>assistant\n"), enc(SUBMIT)
    turns = [Turn(prompt, first, [-0.5] * len(first), [1] * len(first), [1] * len(first), reward=0.0),
             Turn(prompt + first + glue, second, [-0.5] * len(second), [1] * len(second), [1] * len(second), reward=0.25)]
    info = {"task_id": "terminal/grep_files/7", "passed": passed, "status": "pass" if passed else "fail", "ended": "done"}
    if sandbox:
        info["sandbox"] = sandbox
    return Trajectory(turns, 1.0 if passed else 0.0, 0, info)


def _episode(task_id: str, passed: bool) -> dict:
    """A pipeline transcript as episodes_<stage>.jsonl keeps it."""
    return {"task_id": task_id, "passed": passed, "status": "pass" if passed else "fail",
            "messages": [{"role": "system", "content": "You are an agent with tools."}, {"role": "user", "content": "Find the TODOs."},
                         {"role": "assistant", "content": CALL}, {"role": "tool", "content": LONG_OUTPUT},
                         {"role": "assistant", "content": SUBMIT}, {"role": "tool", "content": "submitted"}]}


def _finish(d: Path) -> None:
    (d / "report.html").write_text("<!doctype html><title>report</title>")


def make_runs(root: Path) -> Path:
    tok = byte_tokenizer()
    # a finished GRPO run: metrics (one corrupt line in the middle), a replay log, a before/after evaluation
    grpo = root / "grpo-tiny"
    grpo.mkdir(parents=True)
    (grpo / "config.yaml").write_text(dump_config(RunConfig(name="grpo-tiny", model={"name": "tiny-llama"})))
    write_metrics(grpo, range(1, 4))
    with (grpo / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward": 0.4, "kl": \n')  # a line cut short by a crash of an earlier attempt
    write_metrics(grpo, range(5, 7))
    sandbox = audited_episode(grpo / "audit.jsonl")
    with (grpo / "buffer.jsonl").open("w") as f:
        for step in (1, 2):
            e = Entry(f"{step}.0/0", step, 0, 0, "terminal/grep_files/7",
                      [_trajectory(tok, True, sandbox if step == 1 else None), _trajectory(tok, False)])
            f.write(json.dumps(e.to_json()) + "\n")
            f.write(json.dumps({"op": "take", "step": step, "uids": [e.uid]}) + "\n")
    for label, passed in (("base", [False, True, False, False]), ("trained", [True, True, False, True])):
        EvalResult(label, [f"terminal/t{i}" for i in range(4)], passed, ["pass" if p else "fail" for p in passed]).save(
            grpo / f"eval_{label}.json")
    _finish(grpo)

    # a pipeline: its config and summary, a stage's evaluation and transcripts, the SFT and RL stages
    agent = root / "agent"
    agent.mkdir()
    pcfg = PipelineConfig(name="agent", model={"name": "tiny-llama"}, families=["terminal"])
    (agent / "pipeline_config.json").write_text(json.dumps(pcfg.model_dump(mode="json"), indent=1))
    with (agent / "episodes_base.jsonl").open("w") as f:
        for i in range(30):
            f.write(json.dumps(_episode(f"terminal/grep_files/{i}", i % 3 == 0)) + "\n")
    row = lambda p, n: {"passed": p, "n": n, "pass_rate": p / n, "ci95": [0.1, 0.6], "agent": {"submit_rate": 0.9, "turns_to_submit": 3.5}}
    summary = {"stages": {"base": row(10, 30), "sft": row(14, 30), "rl": row(17, 30)},
               "by_set": {"terminal": {"base": row(10, 30), "sft": row(14, 30), "rl": row(17, 30)}}, "transfer": {},
               "humaneval": {}, "timing_s": {"total": 12.0}, "config": pcfg.model_dump(mode="json"),
               "measured_at": "2026-12-05T22:00:00", "sft_vs_base": {"gained": 5, "lost": 1, "p_value": 0.22, "n": 30}}
    (agent / "pipeline.json").write_text(json.dumps(summary, indent=1))
    for stage, algo in (("sft", "sft"), ("rl", "grpo")):
        s = agent / stage
        s.mkdir()
        (s / "config.yaml").write_text(dump_config(RunConfig(name=stage, model={"name": "tiny-llama"}, algo={"name": algo})))
        write_metrics(s, range(1, 3))
        _finish(s)
    _finish(agent)

    # stopped at step 2 without a report, an hour ago
    crashed = root / "crashed"
    crashed.mkdir()
    (crashed / "config.yaml").write_text(dump_config(RunConfig(name="crashed", algo={"name": "ppo"})))
    write_metrics(crashed, range(1, 3))
    old = time.time() - 3600
    for p in crashed.iterdir():
        os.utime(p, (old, old))

    # still writing
    live = root / "live"
    live.mkdir()
    (live / "config.yaml").write_text(dump_config(RunConfig(name="live", model={"name": "tiny-llama"})))
    write_metrics(live, range(1, 3))
    return root


FAILING_REASON = "the reference solution does not pass (wrong_answer)"


def make_manifest(path: Path) -> Path:
    """An envcheck manifest: funcgen as checked from its code now, with one failing and one flaky
    task; multistep checked from code that has changed since; a family no longer registered."""
    from longhaul.envs import get_family

    entry = {"kind": "answer", "version": "1", "status": "ok", "checked_at": "2026-12-06T06:00:00Z", "runs": 2,
             "checked": 40, "valid": 38, "distinct_valid": 38, "valid_fraction": 0.95, "max_task_s": 0.01,
             "subfamilies": {"funcgen/math.gcd": 20, "funcgen/lists.scale": 18},
             "failing": ["funcgen/v1/bad"], "flaky": ["funcgen/v1/shaky"],
             "reasons": {"funcgen/v1/bad": FAILING_REASON, "funcgen/v1/shaky": "reference ['pass', 'fail'], null ['fail', 'fail'] across runs"},
             "problems": {}}
    families = {
        "funcgen": {**entry, "family": "funcgen", "content_hash": get_family("funcgen").content_hash()},
        "multistep": {**entry, "family": "multistep", "kind": "workspace", "content_hash": "0000000000000000", "failing": [],
                      "flaky": [], "reasons": {}},
        "retired": {**entry, "family": "retired", "content_hash": "1111111111111111"},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"families": families}))
    return path
