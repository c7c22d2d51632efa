"""The packed training forward and the fused LM head against the plain HF path: log-probs,
entropy and gradients (fp32 within 1e-5 / 1e-4 relative; bf16 autocast within bf16 rounding)."""

import copy

import pytest
import torch

from longhaul.models import load_policy
from longhaul.rl import fused_head, packed_forward
from longhaul.rl.fused_head import head_logprobs
from longhaul.rl.logprobs import _token_logprobs, completion_logprobs, shared_prompt_logprobs

PROMPT = "<|im_start|>user\nhello there friend<|im_end|>\n"
COMPS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18], [19]]


def _run(model, fn, args, pad_id, fast, **kw):
    """(logp, mask, entropy, grads) of a weighted sum of the log-probs (mixed signs)."""
    model.zero_grad()
    lp, mask, ent = fn(model, *args, pad_id, 0.7, with_entropy=True, fast=fast, **kw)
    w = torch.linspace(-1, 1, lp.numel()).view_as(lp)
    loss = (lp * w).sum() + (ent.sum() if kw.get("entropy_grad") else 0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), mask, ent.detach(), grads


def _assert_same(plain, fast, lp_tol=1e-5, grad_rel=1e-4):
    (a, ma, ea, ga), (b, mb, eb, gb) = plain, fast
    assert torch.equal(ma, mb)
    assert (a - b).abs().max().item() < lp_tol, f"logprob diff {(a - b).abs().max().item()}"
    assert (ea - eb).abs().max().item() < lp_tol, f"entropy diff {(ea - eb).abs().max().item()}"
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        rel = ((ga[n] - gb[n]).abs().max() / ga[n].abs().max().clamp(min=1e-12)).item()
        assert rel < grad_rel, f"{n}: relative grad diff {rel}"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("layout", ["pairs", "shared"])
def test_packed_path_equals_hf_forward(name, layout):
    model, tok = load_policy(name)
    assert packed_forward.supports(model)
    prompt = tok(PROMPT).input_ids
    if layout == "pairs":  # prompts of different lengths: pad rows on the plain side
        fn, args = completion_logprobs, ([(prompt, c) for c in COMPS] + [(prompt[:3], [4, 5, 6])],)
    else:
        fn, args = shared_prompt_logprobs, (prompt, COMPS)
    _assert_same(_run(model, fn, args, tok.pad_token_id, fast=False), _run(model, fn, args, tok.pad_token_id, fast=True))


def test_entropy_gradient_and_lora_take_the_packed_path_exactly():
    from longhaul.models.lora import apply_lora

    base, tok = load_policy("tiny-llama")
    prompt = tok(PROMPT).input_ids
    args = (prompt, COMPS)
    _assert_same(_run(base, shared_prompt_logprobs, args, tok.pad_token_id, False, entropy_grad=True),
                 _run(base, shared_prompt_logprobs, args, tok.pad_token_id, True, entropy_grad=True))
    lora = apply_lora(copy.deepcopy(base), 4, 16.0, 0.0, ["q_proj", "v_proj", "down_proj"], "tiny-llama")
    with torch.no_grad():  # non-zero B matrices, so the adapters change the forward
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    plain, fast = (_run(lora, shared_prompt_logprobs, args, tok.pad_token_id, f) for f in (False, True))
    assert all("lora_" in n for n in plain[3])  # only the adapters train
    _assert_same(plain, fast)


def test_an_empty_completion_gets_an_all_zero_row():
    model, tok = load_policy("tiny-llama")
    prompt = tok(PROMPT).input_ids
    lp, mask, ent = shared_prompt_logprobs(model, prompt, [[5, 6], [], [7]], tok.pad_token_id, with_entropy=True)
    ref, _, _ = shared_prompt_logprobs(model, prompt, [[5, 6], [7]], tok.pad_token_id, fast=False)
    assert mask.tolist() == [[1, 1], [0, 0], [1, 0]] and lp[1].abs().sum() == 0 and ent[1].abs().sum() == 0
    assert (lp[[0, 2]] - ref).abs().max() < 1e-5


@pytest.mark.parametrize("chunk", [3, 256])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("keep", [True, False])
def test_fused_head_equals_plain_head_values_and_grads(monkeypatch, chunk, temperature, keep):
    monkeypatch.setattr(fused_head, "CHUNK", chunk)  # 3: several chunks and a ragged last one
    monkeypatch.setattr(fused_head, "BACKWARD_CHUNK", 4)  # the recomputed backward: chunks and a ragged last one
    monkeypatch.setattr(fused_head, "KEEP_BYTES", 1 << 30 if keep else 0)  # keep the softmax, or recompute it
    g = torch.Generator().manual_seed(0)
    h = torch.randn(10, 16, generator=g, requires_grad=True)
    w = (torch.randn(50, 16, generator=g) * 0.5).requires_grad_()
    targets = torch.randint(0, 50, (10,), generator=g)
    up = torch.randn(10, generator=g)
    lp, _, ent = _token_logprobs((h @ w.t())[None], targets[None], torch.ones(1, 10), temperature, True)
    (lp[0] * up).sum().backward()
    want = (lp[0].detach(), ent[0].detach(), h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    lp2, ent2 = head_logprobs(h, w, targets, temperature, with_entropy=True)
    (lp2 * up).sum().backward()
    for got, ref in zip((lp2.detach(), ent2, h.grad, w.grad), want):
        assert (got - ref).abs().max().item() < 1e-5
    with torch.no_grad():  # the no-grad path (the reference pass) gives the same values
        lp3, ent3 = head_logprobs(h, w, targets, temperature, with_entropy=False)
    assert ent3 is None and (lp3 - want[0]).abs().max().item() < 1e-5


def test_bf16_autocast_packed_path_within_bf16_rounding():
    model, tok = load_policy("tiny-llama")
    prompt = tok(PROMPT).input_ids
    ref = _run(model, shared_prompt_logprobs, (prompt, COMPS), tok.pad_token_id, False)
    got = _run(model, shared_prompt_logprobs, (prompt, COMPS), tok.pad_token_id, True, autocast="bfloat16")
    assert (got[0] - ref[0]).abs().max().item() < 0.05
    for n in ref[3]:
        rel = ((ref[3][n] - got[3][n]).norm() / ref[3][n].norm().clamp(min=1e-12)).item()
        assert rel < 0.05, f"{n}: relative grad error {rel} under bf16"


@pytest.mark.parametrize("loss_type,aggregation", [("bnpo", "token-mean"), ("grpo", "seq-mean-token-mean")])
def test_grpo_loss_and_grads_equal_trl_on_the_packed_path(monkeypatch, tmp_path, loss_type, aggregation):
    """test_trl_equality's GRPO check with our side on the packed path that GRPOTrainer uses."""
    import functools

    trl_eq = pytest.importorskip("test_trl_equality")  # skips without trl, as that module does
    model, tok = load_policy("tiny-llama")
    model.save_pretrained(tmp_path / "tiny")
    model.config._name_or_path = str(tmp_path / "tiny")
    monkeypatch.setattr(trl_eq, "completion_logprobs", functools.partial(completion_logprobs, fast=True))
    trl_eq.test_grpo_loss_and_grads_equal_trl((model, tok), tmp_path / "out", loss_type, aggregation, 0.28)


def test_prepacked_linears_repack_after_an_in_place_change():
    from longhaul.rl.grpo import frozen_copy

    model, tok = load_policy("tiny-llama")
    ref = frozen_copy(model)
    prompt = tok(PROMPT).input_ids
    q = ref.model.layers[0].self_attn.q_proj
    for step in range(2):
        with torch.no_grad():
            want, _, _ = shared_prompt_logprobs(ref, prompt, COMPS, tok.pad_token_id, 0.7)
            got, _, _ = shared_prompt_logprobs(ref, prompt, COMPS, tok.pad_token_id, 0.7, fast=True)
            assert packed_forward.fast_linear(q) is not q or not torch.backends.mkldnn.is_available()
        assert (got - want).abs().max().item() < 1e-5, f"pass {step}"
        with torch.no_grad():
            q.weight.mul_(1.5)  # an in-place load (e.g. load_state_dict) must not leave a stale packed copy


def test_trainable_weights_are_never_served_from_a_stale_packed_copy():
    """The fused AdamW step changes parameters without bumping their version counter."""
    model, tok = load_policy("tiny-llama")
    prompt = tok(PROMPT).input_ids
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for _ in range(2):
        with torch.no_grad():
            want, _, _ = shared_prompt_logprobs(model, prompt, COMPS, tok.pad_token_id)
            got, _, _ = shared_prompt_logprobs(model, prompt, COMPS, tok.pad_token_id, fast=True)
        assert (got - want).abs().max().item() < 1e-5
        lp, _, _ = shared_prompt_logprobs(model, prompt, COMPS, tok.pad_token_id, fast=True)
        lp.sum().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_recomputed_layers_give_the_same_logprobs_and_gradients(monkeypatch, name):
    """A forward of more than CHECKPOINT_ROWS rows keeps layer inputs only and recomputes each
    layer in backward: the same log-probs and gradients, to rounding, fp32 and under bf16 autocast."""
    model, tok = load_policy(name)
    prompt = tok(PROMPT).input_ids
    args = (prompt, COMPS)
    for autocast, tol in (("none", 1e-6), ("bfloat16", 1e-6)):
        kept = _run(model, shared_prompt_logprobs, args, tok.pad_token_id, True, autocast=autocast)
        monkeypatch.setattr(packed_forward, "CHECKPOINT_ROWS", 0)
        calls = []
        real = packed_forward.checkpoint
        monkeypatch.setattr(packed_forward, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
        again = _run(model, shared_prompt_logprobs, args, tok.pad_token_id, True, autocast=autocast)
        assert len(calls) == model.config.num_hidden_layers
        _assert_same(kept, again, lp_tol=tol, grad_rel=tol)
        monkeypatch.undo()
