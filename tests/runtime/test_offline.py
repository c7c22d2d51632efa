"""Offline runs (sft, rm, dpo, distill) through `longhaul.runtime.train`: each trains, checkpoints,
resumes 2+2 steps bit for bit equal to 4, works with LoRA, and refuses bad datasets clearly."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longhaul.config import load_config
from longhaul.errors import LonghaulError
from longhaul.rl.checkpoint import export_checkpoint
from longhaul.runtime import train
from longhaul.runtime.metrics import without_clock
from longhaul.runtime.offline import batch_indices, split_heldout
from tests.runtime.conftest import report_charts

WORDS = ["apple", "river", "stone", "cloud", "amber", "maple", "cedar", "delta", "ember", "frost", "grove", "haven"]


def _datasets(tmp_path: Path) -> dict[str, Path]:
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": w}]}) + "\n"
                           for i, w in enumerate(WORDS)))
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"pick {i}"}], "chosen": w, "rejected": w[::-1] + "!"}) + "\n"
                             for i, w in enumerate(WORDS)))
    return {"sft": sft, "dpo": prefs, "rm": prefs, "distill": sft}


def _cfg(tmp_path, algo, out, *extra):
    data = _datasets(tmp_path)[algo]
    base = [f"name=t_{algo}", f"output_dir={out}", "model.name=tiny-llama", f"algo.name={algo}", f"data.path={data}",
            "data.batch_size=4", "data.heldout_fraction=0.25", "train.steps=4", "train.save_every=2", "train.lr=1e-3",
            "train.micro_batch=2", "train.autocast=none", "log.progress=false", "log.tensorboard=false"]
    if algo == "distill":
        base.append("algo.teacher=tiny-llama-large")
    return load_config(None, base + list(extra))


ALGOS = ["sft", "rm", "dpo", "distill"]


@pytest.mark.parametrize("algo", ALGOS)
def test_offline_run_resumes_two_plus_two_bit_for_bit(tmp_path, algo):
    a = train(_cfg(tmp_path, algo, tmp_path / "a"))
    train(_cfg(tmp_path, algo, tmp_path / "b", "train.steps=2"))
    train(_cfg(tmp_path, algo, tmp_path / "b"), resume=True)
    ra, rb = tmp_path / "a" / f"t_{algo}", tmp_path / "b" / f"t_{algo}"
    wa, wb = (load_file(r / "checkpoints" / "step_4" / "model.safetensors") for r in (ra, rb))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = (torch.load(r / "checkpoints" / "step_4" / "trainer_state.pt", weights_only=False) for r in (ra, rb))
    assert sa["data_position"] == sb["data_position"] == 16
    for (_, va), (_, vb) in zip(sa["optimizer"]["state"].items(), sb["optimizer"]["state"].items()):
        assert all(torch.equal(va[n], vb[n]) for n in va)
    strip = lambda r: [without_clock(json.loads(x)) for x in (r / "metrics.jsonl").read_text().splitlines()]
    assert strip(ra) == strip(rb)
    assert [json.loads(x)["step"] for x in (ra / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert a["heldout"]["before"] and a["heldout"]["after"].keys() == a["heldout"]["before"].keys()
    assert report_charts((ra / "report.html").read_text()) >= 3
    if algo == "rm":
        assert (ra / "checkpoints" / "step_4" / "reward_head.safetensors").is_file()
        ha, hb = (load_file(r / "checkpoints" / "step_4" / "reward_head.safetensors") for r in (ra, rb))
        assert all(torch.equal(ha[k], hb[k]) for k in ha)


def test_sft_learns_and_lora_trains_only_adapters_and_exports_merged(tmp_path):
    res = train(_cfg(tmp_path, "sft", tmp_path / "f", "train.steps=12", "train.lr=3e-3"))
    assert res["heldout"]["after"]["heldout/loss"] < res["heldout"]["before"]["heldout/loss"]
    train(_cfg(tmp_path, "sft", tmp_path / "l", "train.lora_r=4", "train.lr=1e-2"))
    ckpt = tmp_path / "l" / "t_sft" / "checkpoints" / "step_4"
    adapters = load_file(ckpt / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    out = export_checkpoint(tmp_path / "l" / "t_sft", 4, tmp_path / "merged")
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()


def test_reward_model_lora_checkpoint_loads_as_a_reward_function(tmp_path):
    from longhaul.rl.reward_model import load_reward_model

    train(_cfg(tmp_path, "rm", tmp_path / "r", "train.lora_r=4"))
    out = export_checkpoint(tmp_path / "r" / "t_rm", None, tmp_path / "rm_export")
    assert (out / "reward_head.safetensors").is_file()
    rm, tok = load_reward_model(out)
    scores = rm([tok("pick 1 apple").input_ids, tok("pick 1 elppa!").input_ids])
    assert scores.shape == (2,) and torch.isfinite(scores).all()


def test_data_order_is_a_pure_function_of_the_step_and_covers_each_epoch():
    n, b = 10, 4
    first_epoch = [i for s in range(1, 4) for i in batch_indices(s, b, n, seed=0, shuffle=True)][:n]
    assert sorted(first_epoch) == list(range(n))
    assert batch_indices(3, b, n, 0, True) == batch_indices(3, b, n, 0, True)
    train_rows, held = split_heldout(list(range(20)), 0.25, seed=1)
    assert len(held) == 5 and sorted(train_rows + held) == list(range(20))


def test_bad_datasets_are_refused_with_one_clear_line(tmp_path):
    with pytest.raises(LonghaulError, match="set data.path"):
        train(_cfg(tmp_path, "sft", tmp_path / "x", "data.path=null"))
    with pytest.raises(LonghaulError, match="not found"):
        train(_cfg(tmp_path, "sft", tmp_path / "x", f"data.path={tmp_path / 'nope.jsonl'}"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
    with pytest.raises(LonghaulError, match=r"row 1: .*missing \['rejected'\]"):
        train(_cfg(tmp_path, "dpo", tmp_path / "x", f"data.path={bad}"))
    with pytest.raises(LonghaulError, match="unknown config key 'data.pathh'"):
        _cfg(tmp_path, "sft", tmp_path / "x", "data.pathh=1")
    assert not (tmp_path / "x").exists()  # nothing written for a refused run
