import copy

import pytest

from longhaul.errors import LonghaulError
from longhaul.models import load_policy
from longhaul.rl.data import encode_messages, encode_sft_row, read_jsonl
from longhaul.rl.sft import SFTTrainer


def test_assistant_mask_covers_exactly_the_assistant_text():
    _, tok = load_policy("tiny-llama")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"},
            {"role": "user", "content": "more"}, {"role": "assistant", "content": "sure"}]
    ids, mask = encode_messages(tok, msgs)
    assert len(ids) == len(mask)
    masked = tok.decode([t for t, m in zip(ids, mask) if m])
    assert masked == "hello!<|im_end|>\nsure<|im_end|>\n"
    assert tok.decode(ids) == tok.apply_chat_template(msgs, tokenize=False)


def test_prompt_completion_and_bad_rows(tmp_path):
    _, tok = load_policy("tiny-llama")
    ids, mask = encode_sft_row(tok, {"prompt": "2+2=", "completion": "4"})
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "4<|im_end|>"
    with pytest.raises(LonghaulError, match="'messages' or 'prompt'"):
        encode_sft_row(tok, {"text": "x"})
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"messages": []}\n{oops\n')
    with pytest.raises(LonghaulError, match="line 2"):
        read_jsonl(bad)


def test_sft_memorises_and_accumulation_is_exact():
    model, tok = load_policy("tiny-llama")
    rows = [{"prompt": [{"role": "user", "content": f"word {i}"}], "completion": w} for i, w in enumerate(["apple", "river", "stone", "cloud"])]
    batch = [encode_sft_row(tok, r) for r in rows]
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    SFTTrainer(a, tok.pad_token_id, lr=1e-3, micro_batch=1).step(batch)
    SFTTrainer(b, tok.pad_token_id, lr=1e-3, micro_batch=4).step(batch)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert (p - q).abs().max().item() < 1e-5, n
    trainer = SFTTrainer(model, tok.pad_token_id, lr=3e-3, micro_batch=4)
    first = trainer.step(batch)["loss"]
    for _ in range(40):
        last = trainer.step(batch)["loss"]
    assert last < 0.2 * first, (first, last)
