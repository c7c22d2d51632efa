import pytest
import torch

from longhaul.errors import LonghaulError
from longhaul.models import load_policy
from longhaul.models.byte_tokenizer import byte_tokenizer


def test_byte_tokenizer_round_trips_any_text():
    tok = byte_tokenizer()
    text = "déf f(x):\n    return x * 2  # ünïcode ✓"
    assert tok.decode(tok(text).input_ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_tiny_models_are_seeded_and_do_not_touch_global_rng(name):
    state = torch.get_rng_state()
    a, _ = load_policy(name)
    assert torch.equal(state, torch.get_rng_state())
    b, _ = load_policy(name)
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k


def test_hf_directory_round_trip(tmp_path):
    model, tok = load_policy("tiny-qwen2")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_policy(str(tmp_path))
    ids = torch.tensor([tok("hello").input_ids])
    assert torch.equal(model(ids).logits, again(ids).logits)
    assert tok2.padding_side == "left" and tok2.pad_token is not None


def test_bad_model_inputs_name_the_problem(tmp_path):
    with pytest.raises(LonghaulError, match="neither a built-in"):
        load_policy(str(tmp_path / "nope"))
    with pytest.raises(LonghaulError, match="GGUF file .* not found"):
        load_policy(str(tmp_path / "x.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(LonghaulError, match="could not read GGUF"):
        load_policy(str(bad))
    model, tok = load_policy("tiny-llama")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(LonghaulError, match="missing or corrupt"):
        load_policy(str(tmp_path / "m"))


def test_byte_tokenizer_ids_are_fixed():
    a, b = byte_tokenizer(), byte_tokenizer()
    text = "Say kalo ~\x01é"
    assert a(text).input_ids == b(text).input_ids
    assert a("A").input_ids == [3 + ord("A")]
