"""A GGUF file's block-quantized weights in the engine (`inference/gguf_weights.py`): a tiny
Llama written as llama.cpp's converter writes it (q and k rows interleaved per head, blocks from
gguf-py's quantizer) reads back as exactly the blocks of the HF weights; the runner packed from
the file computes what it computes from those blocks quantized here; the engine's block formats
quantized at load; bad input. The shipped SmolLM2 file: tests/models/test_smollm2.py (slow)."""

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import quantize as gguf_quantize

from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine
from longhaul.inference.gguf_weights import gguf_packer, hf_name, read_blocks
from longhaul.inference.kv_cache import KVCache
from longhaul.inference.model_runner import BatchItem, ModelRunner
from longhaul.inference.quant_blocks import BlockLinear, quantize
from longhaul.models import load_policy

NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter order for q and k rows: each head's rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(path, model, kind=gguf.GGMLQuantizationType.Q4_1, odd=None):
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, t in model.state_dict().items():
        w = t.float().numpy()
        if name == "lm_head.weight":  # tied to the embedding: the file has no output tensor
            continue
        if name == "model.embed_tokens.weight":
            gname, qtype = "token_embd.weight", gguf.GGMLQuantizationType.Q8_0
        elif name.endswith("norm.weight"):
            writer.add_tensor(name.replace("model.", ""), w)  # stored as float: not a block tensor
            continue
        else:
            layer, rest = name.split(".")[2], ".".join(name.split(".")[3:-1])
            gname, qtype = f"blk.{layer}.{NAMES[rest]}.weight", kind
            if rest in ("self_attn.q_proj", "self_attn.k_proj"):
                w = _permute(w, cfg.num_attention_heads if "q_proj" in rest else cfg.num_key_value_heads)
        if gname == odd:
            qtype = gguf.GGMLQuantizationType.Q5_0
        writer.add_tensor(gname, gguf_quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, _ = load_policy("tiny-llama")
    return model, _write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model)


def test_names_map_to_hf():
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.0.attn_norm.weight") is None


def test_the_file_reads_back_as_the_blocks_of_the_hf_weights(tiny):
    model, path = tiny
    blocks = read_blocks(path, model.config)
    sd = model.state_dict()
    expected = {n for n in sd if not n.endswith("norm.weight")}  # with lm_head.weight: the tied head is the embedding
    assert set(blocks) == expected
    for name, (kind, u, d, m) in blocks.items():
        want = quantize(sd.get(name, sd["model.embed_tokens.weight"]), kind)
        assert torch.equal(u, want[0]) and torch.equal(d, want[1]), name
        assert (m is None and want[2] is None) or torch.equal(m, want[2]), name


def test_the_runner_packed_from_the_file_equals_blocks_quantized_here(tiny):
    model, path = tiny
    cfg = model.config
    runners = []
    for from_file in (True, False):
        kv = KVCache(cfg.num_hidden_layers, 8, 4, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads)
        r = ModelRunner(model, kv)
        if from_file:
            packer = gguf_packer(r, read_blocks(path, cfg), torch.float32)
            r.pack_weights(packer, packer)
        else:  # the fused float weights quantized by row blocks: the same codes, concatenated
            r.pack_weights(lambda w, b: (BlockLinear.from_float(w, "q4_1", b), None),
                           lambda w, b: (BlockLinear.from_float(w, "q8_0", b), None))
        runners.append(r)
    assert isinstance(runners[0]._exec[0][1], BlockLinear) and isinstance(runners[0]._lm_head, BlockLinear)
    items = [BatchItem([5, 9, 2, 7], 0, [0]), BatchItem([4, 4], 0, [1])]
    outs = [r.forward(r.prepare(items)) for r in runners]
    assert torch.equal(outs[0], outs[1])
    decode = [BatchItem([3], 4, [0, 2]), BatchItem([8], 2, [1])]
    outs = [r.forward(r.prepare(decode)) for r in runners]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("quant", ["q8_0", "q4_0", "q4_1", "int8"])
def test_quantized_engines_stay_near_the_float_engine(quant):
    """Logits of a prompt's last token within the formats' error of fp32's: a weight moves at
    most one step of its block (1/127, 1/8, 1/15 of the block's range), activations one int8 step."""
    model, _ = load_policy("tiny-llama")
    ids = [5, 9, 2, 7, 1, 3, 11, 2]
    logits = []
    for q in (None, quant):
        engine = LLMEngine(model, quantization=q, adaptive_threads=False)
        seq = engine.runner.prepare([BatchItem(ids, 0, [0, 1])])
        logits.append(engine.runner.forward(seq))
    tol = {"q8_0": 0.02, "int8": 0.02, "q4_1": 0.15, "q4_0": 0.25}[quant]
    diff = (logits[0] - logits[1]).abs().max() / logits[0].abs().max()
    assert 0 < diff <= tol, diff


def test_bad_input_gets_one_line(tmp_path, tiny):
    model, _ = tiny
    odd = _write_tiny_gguf(tmp_path / "odd.gguf", model, odd="blk.1.ffn_up.weight")
    with pytest.raises(LonghaulError, match="'blk.1.ffn_up.weight' is Q5_0, which the engine does not read"):
        read_blocks(odd, model.config)
    with pytest.raises(LonghaulError, match="needs a model loaded from a GGUF file"):
        LLMEngine(model, quantization="gguf")
    with pytest.raises(LonghaulError, match="could not read GGUF file"):
        read_blocks(tmp_path / "missing.gguf", model.config)
