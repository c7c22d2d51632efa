"""`model.rope_scaling`: the trainer's model (HF's rotary module, rebuilt from the scaled
config) and the engine (`ops.rope`, reading that config) rotate alike, and their logits agree
past the model's original length; a scaled export loads back unchanged; bad settings get one
line that names the fix."""

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from longhaul.config import load_config
from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine
from longhaul.inference.model_runner import BatchItem
from longhaul.models import load_policy
from longhaul.ops.rope import Rope

SCALINGS = [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0},
    {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
]
IDS = [s["rope_type"] for s in SCALINGS]


def _scaled(name, scaling):
    cfg = load_config(None, [f"model.name={name}"])
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"rope_scaling": scaling})})
    return load_policy(name, cfg.model.rope_scaling)


@pytest.mark.parametrize("scaling", SCALINGS, ids=IDS)
def test_trainer_and_engine_tables_equal_transformers(scaling):
    model, _ = _scaled("tiny-llama", scaling)
    cfg, rotary = model.config, model.model.rotary_emb
    assert cfg.rope_parameters["rope_type"] == scaling["rope_type"]
    assert cfg.max_position_embeddings == (2048 if scaling["rope_type"] == "dynamic" else int(2048 * scaling["factor"]))
    ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg)
    assert torch.equal(rotary.inv_freq, ref_inv) and rotary.attention_scaling == pytest.approx(ref_scale)
    length = 3000  # past the model's original 2,048 positions
    positions = torch.arange(length)
    x = torch.zeros(1, length, cfg.hidden_size)
    hf_cos, hf_sin = rotary(x, positions[None])
    cos, sin = Rope(cfg, max_positions=length).cos_sin(positions)
    torch.testing.assert_close(cos, hf_cos[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, hf_sin[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("scaling", [SCALINGS[0], SCALINGS[2]], ids=["linear", "yarn"])
def test_engine_logits_equal_the_training_forward_past_the_original_length(scaling):
    model, _ = _scaled("tiny-llama", scaling)
    ids = torch.randint(3, 250, (2300,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0, -1]
    engine = LLMEngine(model, dtype="float32", adaptive_threads=False, num_kv_blocks=160, block_size=16)
    runner = engine.runner
    got = runner.forward(runner.prepare([BatchItem(ids, 0, list(range(145)), 1)]))[0]
    torch.testing.assert_close(got.float(), want, atol=2e-4, rtol=1e-4)
    plain, _ = load_policy("tiny-llama")
    with torch.no_grad():  # the scaling changes what the model computes there
        assert (plain(input_ids=torch.tensor([ids])).logits[0, -1] - want).abs().max() > 1e-3


def test_a_scaled_export_loads_back_unchanged_and_conflicts_are_refused(tmp_path):
    model, tok = _scaled("tiny-qwen2", SCALINGS[2])
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    again, _ = load_policy(str(tmp_path / "m"), {"rope_type": "yarn", "factor": 4.0})
    assert again.config.max_position_embeddings == model.config.max_position_embeddings  # not scaled twice
    assert torch.equal(again.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
    with pytest.raises(LonghaulError, match="already has yarn RoPE scaling"):
        load_policy(str(tmp_path / "m"), {"rope_type": "linear", "factor": 2.0})


@pytest.mark.parametrize("override,message", [
    ("model.rope_scaling={rope_type: longrope, factor: 4}", "not one of linear, dynamic, yarn, llama3"),
    ("model.rope_scaling={rope_type: yarn, factor: 0.5}", "above 1"),
])
def test_bad_rope_scaling_is_one_line(override, message):
    with pytest.raises(LonghaulError, match=message):
        load_config(None, [override])
