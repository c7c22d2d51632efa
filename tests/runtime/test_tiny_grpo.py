"""The smoke run of examples/tiny_grpo.yaml, and exact resume."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from longhaul.config import load_config
from longhaul.models import load_policy
from longhaul.runtime.metrics import without_clock
from longhaul.runtime.online import run_training
from tests.runtime.conftest import report_charts

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_grpo.yaml"


def _weights(run_dir: Path, step: int) -> dict:
    return load_file(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors")


def test_tiny_grpo_trains_and_writes_everything(tmp_path):
    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "log.progress=false"])
    result = run_training(cfg)
    run = tmp_path / "tiny_grpo"
    initial, _ = load_policy("tiny-llama")
    final = _weights(run, 4)
    changed = [k for k, v in initial.state_dict().items() if k in final and not torch.equal(v, final[k])]
    assert len(changed) >= len(final) // 2, f"only {changed} changed"
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "clip_ratio/region_mean", "grad_norm",
                "completions/mean_length", "step_time", "tokens_per_s", "pass_rate"):
        assert key in rows[0], key
    assert any(r["grad_norm"] > 0 for r in rows)
    # the engine's KV pool gave its pages back for every update; measured after it, little is in memory
    assert all(r["memory/kv_slept_gb"] > 0 and r["memory/kv_pool_gb"] < r["memory/kv_slept_gb"] for r in rows), rows[0]
    assert list((run / "tensorboard").glob("events.*"))
    assert report_charts((run / "report.html").read_text()) >= 6
    assert (run / "config.yaml").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_4"]
    assert result["comparison"]["base"]["n"] == 8


def test_resume_two_plus_two_equals_four_bit_for_bit(tmp_path, tiny_grpo_run):
    common = ["log.progress=false", "log.tensorboard=false", "eval.before_after=false"]  # tiny_grpo_run's QUIET
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'b'}", "train.steps=2", *common]))
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'b'}", *common]), resume=True)
    a, b = _weights(tiny_grpo_run, 4), _weights(tmp_path / "b" / "tiny_grpo", 4)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ma = (tiny_grpo_run / "metrics.jsonl").read_text().splitlines()
    mb = (tmp_path / "b" / "tiny_grpo" / "metrics.jsonl").read_text().splitlines()
    strip = lambda rows: [without_clock(json.loads(r)) for r in rows]
    assert strip(ma) == strip(mb)
    sa = torch.load(tiny_grpo_run / "checkpoints" / "step_4" / "trainer_state.pt", weights_only=False)
    sb = torch.load(tmp_path / "b" / "tiny_grpo" / "checkpoints" / "step_4" / "trainer_state.pt", weights_only=False)
    assert sa["data_position"] == sb["data_position"] == 8
    for (ka, va), (kb, vb) in zip(sa["optimizer"]["state"].items(), sb["optimizer"]["state"].items()):
        assert all(torch.equal(va[n], vb[n]) for n in va)


def test_existing_run_dir_is_refused_without_resume(tmp_path):
    import pytest

    from longhaul.errors import LonghaulError

    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "log.progress=false", "train.steps=1", "eval.before_after=false"])
    run_training(cfg)
    with pytest.raises(LonghaulError, match="--resume"):
        run_training(cfg)


def test_export_writes_a_loadable_hf_directory(tmp_path, tiny_grpo_run):
    import pytest

    from longhaul.errors import LonghaulError
    from longhaul.rl.checkpoint import export_checkpoint

    out = export_checkpoint(tiny_grpo_run, 2, tmp_path / "exported")
    assert not (out / "trainer_state.pt").exists()
    model, _ = load_policy(str(out))
    ref = _weights(tiny_grpo_run, 2)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ref.items())
    with pytest.raises(LonghaulError, match="available steps: 2, 4"):
        export_checkpoint(tiny_grpo_run, 3, tmp_path / "x")
    with pytest.raises(LonghaulError, match="not empty"):
        export_checkpoint(tiny_grpo_run, None, out)


def test_grpo_raises_reward_on_a_verifiable_task_within_50_steps(tmp_path):
    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "train.steps=50", "rollout.prompts_per_step=4", "rollout.group_size=8",
                                "train.lr=3e-3", "algo.kl_coef=0.0", "train.save_every=0", "log.progress=false",
                                "log.tensorboard=false", "eval.before_after=false"])
    run_training(cfg)
    rewards = [json.loads(l)["reward"] for l in (tmp_path / "tiny_grpo" / "metrics.jsonl").read_text().splitlines()]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > 3 * first and last > 0.08, (first, last)


def test_lora_trains_only_adapters_resumes_exactly_and_exports_merged(tmp_path):
    from longhaul.rl.checkpoint import export_checkpoint

    common = ["train.lora_r=4", "train.lr=1e-2", "log.progress=false", "log.tensorboard=false", "eval.before_after=false"]
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'a'}", *common]))
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'b'}", "train.steps=2", *common]))
    run_training(load_config(EXAMPLE, [f"output_dir={tmp_path / 'b'}", *common]), resume=True)
    ca, cb = (tmp_path / r / "tiny_grpo" / "checkpoints" / "step_4" for r in ("a", "b"))
    wa, wb = load_file(ca / "adapter_model.safetensors"), load_file(cb / "adapter_model.safetensors")
    assert wa and all("lora_" in k for k in wa)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in wa.items())  # the adapters moved
    out = export_checkpoint(tmp_path / "a" / "tiny_grpo", 4, tmp_path / "merged")
    merged, tok = load_policy(str(out))
    base, _ = load_policy("tiny-llama")
    from longhaul.models.lora import merged_from_checkpoint

    again, _ = merged_from_checkpoint(ca)
    ids = torch.tensor([tok("Say kalo").input_ids])
    with torch.no_grad():
        assert (merged(ids).logits - again(ids).logits).abs().max() < 1e-5
        assert (merged(ids).logits - base(ids).logits).abs().max() > 1e-6  # the merge changed the model


def test_resume_evaluates_the_base_weights_not_the_resumed_ones(tmp_path, monkeypatch):
    """Each evaluation's sampler is probed with one greedy reply: the base probe equals a fresh
    sampler on the initial weights, the trained one does not."""
    import longhaul.runtime.online as sync
    from longhaul.inference import RolloutParams, generate
    from longhaul.runtime.rollout import make_sampler

    seen = {}
    real = sync.evaluate_heldout
    probe = lambda model, tok: generate(model, tok, [tok("Say kalo").input_ids], RolloutParams(max_new_tokens=6, temperature=0))[0]

    def spy(prep, make_model, label, path, *a, **kw):
        def make():
            model = make_model()
            out = probe(model, prep.tok)
            seen[label] = (out.token_ids, out.logprobs)
            return model
        return real(prep, make, label, path, *a, **kw)

    monkeypatch.setattr(sync, "evaluate_heldout", spy)
    common = [f"output_dir={tmp_path}", "log.progress=false", "log.tensorboard=false", "train.lr=5e-2"]
    run_training(load_config(EXAMPLE, [*common, "train.steps=2", "eval.before_after=false"]))
    cfg = load_config(EXAMPLE, [*common, "train.steps=4"])
    run_training(cfg, resume=True)
    initial, tok = load_policy("tiny-llama")
    fresh = probe(make_sampler(cfg, initial, tok), tok)
    assert seen["base"] == (fresh.token_ids, fresh.logprobs)
    assert seen["trained"][1] != fresh.logprobs
