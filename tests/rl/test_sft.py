import copy

import pytest
import torch

from longhaul.errors import LonghaulError
from longhaul.models import load_policy
from longhaul.rl.data import encode_messages, encode_sft_row, read_jsonl
from longhaul.config import AlgoConfig, TrainConfig
from longhaul.rl import logprobs, packed_forward
from longhaul.rl.sft import SFTTrainer, masked_logprobs, pack_rows, packed_logprobs


def _trainer(model, tok, lr, micro_batch, packing=False, max_length=1024):
    return SFTTrainer(model, tok.pad_token_id, AlgoConfig(name="sft"), TrainConfig(lr=lr, micro_batch=micro_batch, autocast="none"),
                      packing=packing, max_length=max_length)


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
    for m, mb in ((a, 1), (b, 4)):
        # SGD at lr 1: the step is the clipped gradient, so the runs differ by its rounding (<= 6e-8
        # on torch's AVX-512, AVX2 and scalar kernels). Adam's first step, lr * g / (|g| + eps),
        # turns rounding in near-zero gradients into up to 5.6e-6 of the 1e-5 below, by host
        t = _trainer(m, tok, 1e-3, mb)
        t.optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
        t.scheduler = torch.optim.lr_scheduler.LambdaLR(t.optimizer, lambda _: 1.0)
        t.step(batch)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert (p - q).abs().max().item() < 1e-5, f"{n}: max diff {(p - q).abs().max().item():.3g}"
    trainer = _trainer(model, tok, 3e-3, 4)
    first = trainer.step(batch)["loss"]
    for _ in range(40):
        last = trainer.step(batch)["loss"]
    assert last < 0.2 * first, (first, last)


def test_a_row_longer_than_the_bins_gets_a_bin_of_its_own():
    rows = [([1] * n, [1] * n) for n in (30, 9, 8, 7, 50)]
    assert [[len(r[0]) for r in b] for b in pack_rows(rows, max_length=20)] == [[50], [30], [9, 8], [7]]


def test_packing_gives_the_padded_loss_and_gradient():
    """Packed rows (block-diagonal attention, per-row positions) compute exactly what padded rows do."""
    model, tok = load_policy("tiny-llama")
    rows = [encode_sft_row(tok, {"prompt": [{"role": "user", "content": "x" * (3 * i + 1)}], "completion": "ok " * (i + 1)})
            for i in range(6)]
    bins = pack_rows(rows, max_length=max(len(r[0]) for r in rows) * 2)
    assert len(bins) < len(rows) and sorted(map(len, (r for b in bins for r in b))) == sorted(map(len, rows))
    n_tok = sum(sum(m[1:]) for _, m in rows)
    grads = []
    for packed in (False, True):
        model.zero_grad()
        logp, mask = packed_logprobs(model, bins, tok.pad_token_id) if packed else masked_logprobs(model, rows, tok.pad_token_id)
        assert mask.sum().item() == n_tok
        loss = -(logp * mask).sum() / n_tok
        loss.backward()
        grads.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = grads
    assert abs(l0 - l1) < 1e-5, (l0, l1)
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-5), f"{n}: {(g0[n] - g1[n]).abs().max()}"
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    ea = _trainer(a, tok, 1e-3, 8).evaluate(rows)
    eb = _trainer(b, tok, 1e-3, 8, packing=True, max_length=64).evaluate(rows)
    assert abs(ea["heldout/loss"] - eb["heldout/loss"]) < 1e-5


def test_flat_packing_of_multi_turn_rows_gives_the_padded_loss_and_gradient():
    """`pack_targets` (rows end to end, attention per row, the head on assistant positions only)
    against HF's padded forward, on multi-turn rows whose loss mask has several spans. fp32
    rounding between two orders of the same sums: log-probs of order 1 differ by ~1e-6, so 1e-5
    absolute on the mean loss; gradients (entries up to ~1) to 1e-4 relative to each tensor's
    largest entry."""
    model, tok = load_policy("tiny-llama")
    rows = []
    for i in range(5):
        msgs = [{"role": "system", "content": "tools " * (i + 2)}, {"role": "user", "content": f"task {i}"}]
        for t in range(i % 3 + 1):
            msgs += [{"role": "assistant", "content": f"call {t} " * (t + 2)}, {"role": "tool", "content": "out " * (3 * t + i)}]
        msgs.append({"role": "assistant", "content": "done"})
        rows.append(encode_messages(tok, msgs))
    assert all(sum(1 for a, b in zip(m, m[1:]) if b and not a) >= 2 for _, m in rows)  # several assistant spans
    n_tok = sum(sum(m[1:]) for _, m in rows)
    results = []
    for flat in (False, True):
        model.zero_grad()
        if flat:
            logp, mask, _ = logprobs.packed_logprobs(model, packed_forward.pack_targets(rows, tok.pad_token_id))
        else:
            logp, mask = masked_logprobs(model, rows, tok.pad_token_id)
        assert mask.sum().item() == n_tok
        loss = -(logp * mask).sum() / n_tok
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = results
    assert abs(l0 - l1) < 1e-5, (l0, l1)
    for n in g0:
        scale = g0[n].abs().max().item()
        assert (g0[n] - g1[n]).abs().max().item() <= 1e-4 * max(scale, 1e-6), n
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    sa = _trainer(a, tok, 1e-3, 2).step(rows)
    sb = _trainer(b, tok, 1e-3, 2, packing=True, max_length=96).step(rows)
    assert sa["num_tokens"] == sb["num_tokens"] and abs(sa["loss"] - sb["loss"]) < 1e-5
