"""The asynchronous runtime on the tiny model: staleness 0 is the synchronous run exactly, the
staleness bound holds, partial rollouts record their versions, failed workers lose nothing."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longhaul.config import load_config
from longhaul.runtime.metrics import without_clock
from longhaul.runtime.online import run_training
from tests.waiting import Gate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_grpo.yaml"
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.before_after=false"]
RUNTIME_KEYS = ("staleness/", "rollout/", "buffer/", "weight_sync/", "dynamic_sampling/")  # what only the runtime reports


def _rows(run: Path) -> list[dict]:
    rows = [without_clock(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(RUNTIME_KEYS)} for r in rows]


def _final(run: Path, step: int = 4) -> dict:
    return load_file(run / "checkpoints" / f"step_{step}" / "model.safetensors")


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_async_with_staleness_zero_reproduces_sync_exactly(tmp_path, kind, tiny_grpo_run):
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'async'}", *QUIET, "runtime.mode=async", "runtime.max_staleness=0",
                                       f"runtime.worker_kind={kind}", "runtime.worker_threads=1"]))
    a, b = tiny_grpo_run, tmp_path / "async" / "tiny_grpo"
    ra, rb = _rows(a), _rows(b)
    assert len(ra) == 4 and ra == rb, "async at staleness 0 must reproduce the synchronous losses and metrics"
    wa, wb = _final(a), _final(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    async_rows = [json.loads(line) for line in (b / "metrics.jsonl").read_text().splitlines()]
    assert all(r["staleness/max"] == 0 for r in async_rows)


@pytest.mark.parametrize("kv", ["recompute", "keep"])
def test_staleness_bound_holds_and_rollouts_run_ahead(tmp_path, kv):
    s = 2
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path}", *QUIET, "train.steps=8", "runtime.mode=async",
                                       f"runtime.max_staleness={s}", "runtime.worker_kind=thread", f"runtime.inflight_kv={kv}"]))
    run = tmp_path / "tiny_grpo"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert all(r["staleness/max"] <= s for r in rows)
    log = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    puts = {r["uid"]: r for r in log if r["op"] == "put"}
    for take in (r for r in log if r["op"] == "take"):
        for uid in take["uids"]:
            versions = [v for t in puts[uid]["group"] for turn in t["turns"] for v in turn["versions"]]
            assert take["step"] - 1 - min(versions) <= s, (take["step"], uid, min(versions))
    submits = [r for r in log if r["op"] == "submit"]
    assert [r["min_version"] for r in submits] == [max(0, r["step"] - 1 - s) for r in submits]
    assert len({r["uid"] for r in submits}) == len(submits) == 8
    # every trained group was generated, and only once: nothing lost, nothing duplicated
    taken = [u for r in log if r["op"] == "take" for u in r["uids"]]
    assert len(taken) == len(set(taken)) == 8 * 2


def _two_versions():
    """The tiny policy at version 0 and a "trained" version 1 (every weight moved), and its tokenizer."""
    from longhaul.models import load_policy

    torch.manual_seed(0)
    v0, tok = load_policy("tiny-llama")
    v1, _ = load_policy("tiny-llama")
    with torch.no_grad():
        for p in v1.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return v0, v1, tok


def test_partial_rollout_switches_weights_mid_generation_and_records_versions():
    """Greedy generation from a worker; new weights land after some tokens: the tokens before
    carry version 0 and are v0's greedy choices, the rest carry version 1 and are v1's."""
    import threading

    from longhaul.inference import LLMEngine, RolloutParams, generate
    from longhaul.runtime.pool import policy_tensors

    v0, v1, tok = _two_versions()
    engine = LLMEngine(model=v0, tokenizer=tok, dtype="float32")
    prompt = tok("Say kalo kalo kalo", add_special_tokens=False).input_ids
    params = RolloutParams(max_new_tokens=120, temperature=0)
    seen = {}

    def gen():
        seen["out"] = generate(engine, tok, [prompt], params)[0]

    # the generating thread is held before its step after token 10 until the new weights are in: however the
    # threads are scheduled, the load lands mid-generation (not after the last token)
    engine.step_hook = gate = Gate(lambda: engine.stats()["generation_tokens_total"] >= 10)
    th = threading.Thread(target=gen)
    th.start()
    try:
        gate.wait(alive=th.is_alive)
        engine.update_weights(policy_tensors(v1), version=1)
    finally:
        gate.open()
        th.join()
    out = seen["out"]
    k = out.versions.index(1)
    assert 10 <= k < len(out.token_ids) and out.versions == [0] * k + [1] * (len(out.versions) - k)
    ref = lambda model, n: generate(LLMEngine(model=model, tokenizer=tok, dtype="float32"), tok, [prompt + out.token_ids[:n]],
                                    RolloutParams(max_new_tokens=1, temperature=0))[0].token_ids[0]
    assert out.token_ids[k - 1] == ref(v0, k - 1), "before the switch: version 0's greedy token"
    assert out.token_ids[k] == ref(v1, k), "after the switch: version 1's greedy token on the same prefix"


@pytest.mark.parametrize("kv", ["recompute", "keep"])
def test_a_worker_keeps_or_recomputes_inflight_kv_as_configured(kv):
    """runtime.inflight_kv reaches the engine: a load mid-generation re-prefills the sequences in
    flight (recompute) or leaves them decoding on their K/V (keep); versions switch either way."""
    import threading

    from longhaul.inference import RolloutParams, generate
    from longhaul.runtime.pool import policy_tensors
    from longhaul.runtime.families import build_family
    from longhaul.runtime.rollout import RolloutWorker, make_sampler

    cfg = load_config(EXAMPLE, [f"runtime.inflight_kv={kv}"])
    v0, v1, tok = _two_versions()
    worker = RolloutWorker(cfg, build_family(cfg), tok, make_sampler(cfg, v0, tok))
    prompt = tok("Say kalo kalo kalo", add_special_tokens=False).input_ids
    seen = {}
    # held before the step after token 12 (4 per sequence) until the load is done: all three are still in flight
    worker.sampler.step_hook = gate = Gate(lambda: worker.sampler.stats()["generation_tokens_total"] >= 12)
    th = threading.Thread(target=lambda: seen.update(out=generate(worker.sampler, tok, [prompt] * 3,
                                                                  RolloutParams(max_new_tokens=80, temperature=0))))
    th.start()
    try:
        gate.wait(alive=th.is_alive)
        worker.load_weights(policy_tensors(v1), 1)
    finally:
        gate.open()
        th.join()
    assert all(0 < c.versions.index(1) < len(c.versions) for c in seen["out"])
    assert worker.sampler.stats()["num_recomputed_total"] == (0 if kv == "keep" else 3)


def _process_pool_running(tmp_path, requests: int, overrides: list[str]):
    """A started one-worker ProcessRollouts pool with `requests` requests of 2 tasks submitted."""
    from longhaul.models import load_policy
    from longhaul.runtime.local import ProcessRollouts
    from longhaul.runtime.families import build_family
    from longhaul.runtime.rollout import RolloutRequest

    cfg = load_config(EXAMPLE, ["runtime.mode=async", "runtime.worker_threads=1", *overrides])
    policy, tok = load_policy("tiny-llama")
    family = build_family(cfg)
    tasks = family.make_split("train", 2 * requests, 1, None)
    pool = ProcessRollouts(cfg, family, tok, policy, tmp_path)
    try:
        pool.start()
        for i in range(requests):
            pool.submit(RolloutRequest(i + 1, 0, tasks[2 * i:2 * i + 2], seed=i, min_version=0))
    except BaseException:
        pool.close()
        raise
    return cfg, pool


def test_a_killed_process_worker_loses_no_request(tmp_path):
    """Kill the worker while it runs a request: the pool replaces it and requeues that request."""
    import os
    import signal
    import time

    cfg, pool = _process_pool_running(tmp_path, 3, ["rollout.max_new_tokens=16"])
    try:
        got = {}
        killed = False
        deadline = time.monotonic() + 600
        while len(got) < 3 and time.monotonic() < deadline:
            if not killed and pool._running:
                wid = next(iter(pool._running.values()))[0]
                os.kill(pool.pids[wid], signal.SIGKILL)
                killed = True
            for res in pool.poll(timeout=0.5):
                got[res.uid] = res
        assert killed and sorted(got) == ["1.0", "2.0", "3.0"]
        assert pool.restarts >= 1 and pool.requeued >= 1
        assert all(len(r.groups) == 2 and len(r.groups[0]) == cfg.rollout.group_size and r.error is None for r in got.values())
    finally:
        pool.close()


def test_a_crashed_async_run_resumes_from_its_checkpoint_and_buffer(tmp_path, monkeypatch):
    """The trainer dies after step 3 (checkpoint at 2). The resumed run trains steps 3-6 on the
    groups generated before the crash wherever they had finished, and loses none."""
    from longhaul.rl.grpo import GRPOTrainer

    real, calls = GRPOTrainer.step, {"n": 0}

    def crashing(self, groups):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("simulated trainer crash")
        return real(self, groups)

    monkeypatch.setattr(GRPOTrainer, "step", crashing)
    overrides = [f"output_dir={tmp_path}", *QUIET, "train.steps=6", "train.save_every=2", "runtime.mode=async",
                 "runtime.max_staleness=2", "runtime.worker_kind=thread"]
    with pytest.raises(RuntimeError, match="simulated"):
        run_training(load_config(EXAMPLE, overrides))
    run = tmp_path / "tiny_grpo"
    before = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    put_before = {r["uid"] for r in before if r["op"] == "put"}
    assert any(u.startswith(("4.", "5.")) for u in put_before), "rollouts ran ahead of the crashed trainer"
    monkeypatch.setattr(GRPOTrainer, "step", real)
    run_training(load_config(EXAMPLE, overrides), resume=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    log = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    puts = [r["uid"] for r in log if r["op"] == "put"]
    assert len(puts) == len(set(puts)), "no group was generated twice"
    taken = {u: r["step"] for r in log if r["op"] == "take" for u in r["uids"]}
    assert sorted(taken.values()) == sorted(s for s in range(1, 7) for _ in range(2))
    # the checkpoint (step 2) knew requests 1-4 (admitted up to 2 + max_staleness): their groups train their own steps;
    # later ones were drawn after it, so the resumed run draws them again (new ids, epoch 1)
    reused = [u for u in put_before if u.split(".")[0] in ("3", "4")]
    assert reused and all(taken[u] == int(u.split(".")[0]) for u in reused), "pre-crash groups train their own steps"
    assert not [u for u in put_before if u.split(".")[0] in ("5", "6") and u in taken]
    assert {u.split("/")[0] for u in taken if taken[u] >= 5} <= {"5.0e1", "6.0e1"}


@pytest.mark.slow  # ~35 s: a follower process starts; tests/rl/test_distributed.py checks the maths fast
def test_two_data_parallel_trainers_train_like_one(tmp_path, tiny_grpo_run, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the trainers' rendezvous directory goes
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'two'}", *QUIET, "runtime.trainers=2"]))
    assert not list(scratch.iterdir()), "the rendezvous directory is removed when the trainers close"
    a, b = _final(tiny_grpo_run), _final(tmp_path / "two" / "tiny_grpo")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-5, f"max parameter difference {worst:.3g}"
    ra, rb = _rows(tiny_grpo_run), _rows(tmp_path / "two" / "tiny_grpo")
    assert [r["reward"] for r in ra] == pytest.approx([r["reward"] for r in rb], abs=1e-6)


@pytest.mark.slow  # ~40 s: followers start twice; tests/rl/test_context_parallel_training.py checks the maths fast
@pytest.mark.parametrize("replicas,share", [(1, "true"), (2, "false")])
def test_a_grpo_run_split_over_two_processes_trains_and_resumes_like_one(tmp_path, tiny_grpo_run, replicas, share):
    """train.context_parallel=2 (each row split by ring attention: a group's prompt once, then its
    completions, or each (prompt, completion) apart), on one or two data-parallel replicas
    (runtime.trainers), two steps, then resumed for two more (the followers read the checkpoint):
    the weights of the plain run."""
    split = [f"output_dir={tmp_path}", *QUIET, "train.context_parallel=2", f"train.share_prompt={share}", f"runtime.trainers={replicas}"]
    run_training(load_config(EXAMPLE, [*split, "train.steps=2"]))
    run_training(load_config(EXAMPLE, split), resume=True)
    a, b = _final(tiny_grpo_run), _final(tmp_path / "tiny_grpo")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    # a shared prompt's rows and the split rows sum in other orders; Adam's step turns the rounding of a
    # near-zero gradient into up to lr, where a wrong gradient moves weights by ~lr each step
    assert worst < 1e-4, f"max parameter difference {worst:.3g}"
    ra, rb = _rows(tiny_grpo_run), _rows(tmp_path / "tiny_grpo")
    assert [r["reward"] for r in ra] == pytest.approx([r["reward"] for r in rb], abs=1e-6)
    assert [r["loss"] for r in ra] == pytest.approx([r["loss"] for r in rb], rel=1e-4, abs=1e-6)


def test_a_worker_runs_admitted_requests_side_by_side_on_one_engine(tmp_path):
    """With worker_inflight 2 a single process worker serves two requests at once (their
    generation shares the engine's batches); results still come back whole and in order of uid."""
    import time

    cfg, pool = _process_pool_running(tmp_path, 2, ["runtime.worker_inflight=2", "rollout.max_new_tokens=48"])
    try:
        got, deadline = {}, time.monotonic() + 300
        while len(got) < 2 and time.monotonic() < deadline:
            for res in pool.poll(timeout=0.5):
                got[res.uid] = res
        a, b = got["1.0"], got["2.0"]
        assert a.started < b.finished and b.started < a.finished, "the two requests ran at the same time"
        assert all(len(r.groups) == 2 and len(r.groups[0]) == cfg.rollout.group_size for r in (a, b))
    finally:
        pool.close()
