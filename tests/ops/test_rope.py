"""RoPE frequencies, tables and rotation against transformers' own, for every supported type."""

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from longhaul.errors import LonghaulError
from longhaul.ops.rope import Rope, apply_rope, rope_init

MAX_POS = 512  # the tiny configs' max positions; yarn/llama3 were "trained" on 128 of them
ORIGINAL = 128

# (rope_parameters, head_dim): several parameter sets a type, incl. the DeepSeek-style yarn mscales.
CASES = {
    "default": [({"rope_theta": 10000.0}, 16), ({"rope_theta": 1e6}, 64)],
    "linear": [({"rope_theta": 10000.0, "factor": 2.0}, 16), ({"rope_theta": 5e5, "factor": 4.0}, 64)],
    "dynamic": [({"rope_theta": 10000.0, "factor": 2.0}, 16), ({"rope_theta": 1e6, "factor": 3.5}, 64)],
    "yarn": [
        ({"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": ORIGINAL}, 16),
        ({"rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
          "beta_fast": 16, "beta_slow": 2, "truncate": False}, 64),
        ({"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
          "mscale": 1.0, "mscale_all_dim": 0.707}, 64),
        ({"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
          "attention_factor": 1.3}, 32),
    ],
    "llama3": [
        ({"rope_theta": 5e5, "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": ORIGINAL}, 64),
        ({"rope_theta": 10000.0, "factor": 2.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
          "original_max_position_embeddings": ORIGINAL}, 32),
    ],
}
ALL = [(t, p, d) for t, sets in CASES.items() for p, d in sets]
IDS = [f"{t}-{i}" for t, sets in CASES.items() for i in range(len(sets))]


def llama_config(rope_type, params, head_dim):
    heads = 2
    return LlamaConfig(hidden_size=head_dim * heads, num_attention_heads=heads, num_key_value_heads=heads,
                       head_dim=head_dim, max_position_embeddings=MAX_POS,
                       rope_parameters={"rope_type": rope_type, **params})


def hf_init(config, seq_len=None):
    kind = config.rope_parameters["rope_type"]
    if kind == "default":  # not in ROPE_INIT_FUNCTIONS; each model carries its own
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=seq_len)


def hf_rotate(config, x, positions):
    """HF's rotary embedding + apply_rotary_pos_emb on x (N, H, D) at positions (N,), as a forward sees them."""
    rotary = LlamaRotaryEmbedding(config)  # fresh: dynamic NTK is stateful in HF
    cos, sin = rotary(x, positions[None])  # (1, N, D) in x's dtype
    q = x.transpose(0, 1)[None]  # (1, H, N, D)
    out, _ = apply_rotary_pos_emb(q, q, cos, sin)
    return out[0].transpose(0, 1), cos[0], sin[0]


def close(a, b, atol, rtol=0.0, what=""):
    diff = (a.double() - b.double()).abs().max().item()
    assert torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol), f"{what}: max abs diff {diff:.3g}"
    return diff


@pytest.mark.parametrize("rope_type,params,head_dim", ALL, ids=IDS)
@pytest.mark.parametrize("seq_len", [None, 100, 700, 2000])
def test_rope_init_equals_hf(rope_type, params, head_dim, seq_len):
    config = llama_config(rope_type, params, head_dim)
    inv_freq, scaling = rope_init(config, seq_len)
    ref_inv_freq, ref_scaling = hf_init(config, seq_len)
    assert inv_freq.shape == (head_dim // 2,) and inv_freq.dtype == torch.float32
    close(inv_freq, ref_inv_freq, atol=0.0, rtol=1e-6, what="inv_freq")
    assert scaling == pytest.approx(ref_scaling, rel=1e-6)


@pytest.mark.parametrize("rope_type,params,head_dim", ALL, ids=IDS)
def test_cos_sin_and_apply_equal_hf_forward(rope_type, params, head_dim):
    config = llama_config(rope_type, params, head_dim)
    rope = Rope(config)
    # A prefill within the trained length; for dynamic also one past it, where the frequencies change.
    for length in [200] + ([MAX_POS + 300] if rope_type == "dynamic" else []):
        positions = torch.arange(length)
        x = torch.randn(length, 2, head_dim, generator=torch.Generator().manual_seed(length))
        ref, ref_cos, ref_sin = hf_rotate(config, x, positions)
        cos, sin = rope.cos_sin(positions)
        assert cos.shape == (length, head_dim) and cos.dtype == torch.float32
        close(cos, ref_cos, atol=1e-6, what=f"cos L={length}")
        close(sin, ref_sin, atol=1e-6, what=f"sin L={length}")
        out = apply_rope(x, cos, sin)
        assert out.shape == x.shape and out.dtype == x.dtype
        close(out, ref, atol=1e-5, what=f"rotated L={length}")


@pytest.mark.parametrize("rope_type,params,head_dim", ALL, ids=IDS)
def test_decode_positions_index_the_prefill_table(rope_type, params, head_dim):
    """A decode batch (scattered positions, one per sequence) gets the rows a full forward would."""
    config = llama_config(rope_type, params, head_dim)
    rope = Rope(config)
    full_cos, full_sin = Rope(config).cos_sin(torch.arange(MAX_POS))
    positions = torch.tensor([511, 3, 0, 250, 17])
    cos, sin = rope.cos_sin(positions)
    assert torch.equal(cos, full_cos[positions]) and torch.equal(sin, full_sin[positions])


def test_dynamic_past_original_length_matches_hf_last_step():
    """Decoding token L-1 alone gets the frequencies of HF's forward over 0..L-1."""
    config = llama_config("dynamic", {"rope_theta": 10000.0, "factor": 2.0}, 16)
    length = MAX_POS + 77
    x = torch.randn(length, 2, 16, generator=torch.Generator().manual_seed(0))
    ref, _, _ = hf_rotate(config, x, torch.arange(length))
    cos, sin = Rope(config).cos_sin(torch.tensor([length - 1]))
    close(apply_rope(x[-1:], cos, sin), ref[-1:], atol=1e-5, what="last token")
    # Within the trained length dynamic is the unscaled RoPE.
    default = Rope(llama_config("default", {"rope_theta": 10000.0}, 16))
    assert torch.equal(Rope(config).cos_sin(torch.arange(MAX_POS))[0], default.cos_sin(torch.arange(MAX_POS))[0])


@pytest.mark.parametrize("rope_type,params,head_dim", [a for a in ALL if a[0] != "dynamic"][::2])
def test_bf16_matches_hf_and_stays_close_to_float32(rope_type, params, head_dim):
    config = llama_config(rope_type, params, head_dim)
    positions = torch.arange(300)
    x = torch.randn(300, 2, head_dim, generator=torch.Generator().manual_seed(1))
    cos, sin = Rope(config).cos_sin(positions)
    out = apply_rope(x.bfloat16(), cos, sin)
    assert out.dtype == torch.bfloat16
    ref_bf16, _, _ = hf_rotate(config, x.bfloat16(), positions)
    close(out, ref_bf16, atol=0.0, what="bf16 vs HF bf16")  # same ops in the same order: bit-equal
    exact = apply_rope(x.double(), cos.double(), sin.double())
    # bf16 keeps 8 mantissa bits: cos/sin, the two products and the sum round each, |out| <= ~5.
    close(out, exact, atol=0.05, what="bf16 vs float64")


def test_default_equals_unscaled_hf_rope_for_qwen2():
    config = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rope_theta=1e6)
    positions = torch.arange(256)
    x = torch.randn(256, 4, 16, generator=torch.Generator().manual_seed(2))
    ref_cos, ref_sin = Qwen2RotaryEmbedding(config)(x, positions[None])
    cos, sin = Rope(config).cos_sin(positions)
    close(cos, ref_cos[0], atol=1e-6, what="cos")
    close(sin, ref_sin[0], atol=1e-6, what="sin")
    ref, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], ref_cos, ref_sin)
    close(apply_rope(x, cos, sin), ref[0].transpose(0, 1), atol=1e-5, what="rotated")


def test_legacy_rope_scaling_fields_are_read():
    config = LlamaConfig(hidden_size=32, num_attention_heads=2, max_position_embeddings=MAX_POS,
                         rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=5e5)
    inv_freq, _ = rope_init(config)
    ref, _ = ROPE_INIT_FUNCTIONS["linear"](config, None)
    close(inv_freq, ref, atol=0.0, rtol=1e-6, what="inv_freq")


def test_unsupported_type_names_itself_and_the_supported_ones():
    config = llama_config("longrope", {"rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                                       "original_max_position_embeddings": ORIGINAL}, 16)
    with pytest.raises(LonghaulError, match="longrope.*default, linear, dynamic, yarn, llama3"):
        Rope(config)
