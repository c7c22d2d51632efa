"""A GGUF file's quantized weights as the engine's block linears, without a detour through floats.

Owns reading a Llama GGUF's Q8_0 / Q4_0 / Q4_1 tensors (gguf-py's reader, memory-mapped), naming
them as HF does, undoing the row order llama.cpp's converter gives q and k (it interleaves each
head's two rotary halves), and the packer that hands the runner's fused projections their
blocks. Float tensors in the file (norms) and the weights the file stores unquantized keep the
runner's own float weights. Does not own the formats (`quant_blocks`) or loading a model
(`models.loader`, which dequantizes the same file for training).
"""

from __future__ import annotations

from pathlib import Path

import torch

from longhaul.errors import LonghaulError
from longhaul.inference.quant_blocks import FORMATS, BlockLinear, concat, decode
from longhaul.ops.linear import pack

_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; the embedding and the
    output head by their HF names; None for anything else (norms)."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _NAMES and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{_NAMES[parts[2]]}.weight"
    return None


def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows in llama.cpp's order (per head: rotary pairs interleaved) -> HF's (per head: the first
    halves, then the second halves). t: (heads * head_dim, ...) codes or per-row scales."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def read_blocks(path: str | Path, config) -> dict[str, tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """HF name -> (format, u, d, m) for every block-quantized tensor of a Llama GGUF."""
    import gguf  # declared dependency; imported here so the engine starts without touching it

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # gguf-py raises several types for a bad file
        raise LonghaulError(f"could not read GGUF file {str(path)!r} ({type(e).__name__}); check the file is a complete GGUF model") from e
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    if arch != "llama":
        raise LonghaulError(f"GGUF weights of architecture {arch!r} cannot be imported as blocks; only llama is supported: "
                            f"use quantization q4_0, q4_1 or q8_0 to quantize at load instead")
    out = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        kind = t.tensor_type.name.lower()
        if name is None or kind in ("f32", "f16", "bf16"):
            continue
        if kind not in FORMATS:
            raise LonghaulError(f"GGUF tensor {t.name!r} is {t.tensor_type.name}, which the engine does not read; "
                                f"readable: {', '.join(f.upper() for f in FORMATS)} (or quantize at load)")
        k, n = (int(s) for s in t.shape)  # GGUF lists dims innermost first
        u, d, m = decode(t.data, kind, n, k)
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in t.name else config.num_key_value_heads
            u, d = unpermute_rows(u, heads), unpermute_rows(d, heads)
            m = None if m is None else unpermute_rows(m, heads)
        out[name] = (kind, u, d, m)
    if getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in out:
        out.setdefault("lm_head.weight", out["model.embed_tokens.weight"])
    return out


def gguf_packer(runner, blocks: dict, dtype: torch.dtype):
    """A `ModelRunner.pack_weights` packer: each fused projection whose parts the file stores as
    blocks becomes one `BlockLinear` (parts concatenated by rows, as the runner fuses them); any
    other weight goes to `linear.pack`. For a runner that still holds its plain weights (before
    `ModelRunner.drop_plain`): the packer knows a fused tensor by identity."""
    parts: dict[int, dict[int, str]] = {}  # fused tensor -> first row -> the HF name there
    for name, (tensor, r0, _) in sorted(runner.targets().items()):
        if name in blocks or r0 not in parts.get(id(tensor), {}):  # a tied head and embedding share rows
            parts.setdefault(id(tensor), {})[r0] = name
    made: dict[str, BlockLinear] = {}

    def block(name: str) -> BlockLinear:
        if name not in made:
            kind, u, d, m = blocks[name]
            made[name] = BlockLinear(u, d, m, kind, dtype=dtype)
        return made[name]

    def packer(w, b):
        names = [n for _, n in sorted(parts.get(id(w), {}).items())]
        if names and all(n in blocks for n in names):
            return (block(names[0]) if len(names) == 1 and b is None else concat([block(n) for n in names], b)), None
        return pack(w, b)

    return packer
