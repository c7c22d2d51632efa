"""Tiled attention over packed rows against SDPA with the packed layout's dense mask, forward and
backward, fp32 and bf16, on ragged rows (queries fewer than keys, a row of one query); long whole
rows through SDPA's causal kernel instead, checked the same way."""

import pytest
import torch
import torch.nn.functional as F

from longhaul.rl import packed_forward, tiled_attention
from longhaul.rl.tiled_attention import packed_sdpa, worth_tiling

# (prompt, completion) pairs: a long row, a short one, a row whose completion is one token
PAIRS = [(list(range(50)), list(range(300))), (list(range(10)), list(range(77))), (list(range(200)), [1])]


def _inputs(b, hkv: int, g: int, d: int, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    R, tq = b.q_index.shape
    lk = b.kv_index.shape[1]
    q, k, v = (torch.randn(R, hkv, n, d, generator=gen, dtype=torch.float64) for n in (g * tq, lk, lk))
    go = torch.randn(R, hkv, g * tq, d, generator=gen, dtype=torch.float64)
    real = torch.zeros(R, 1, g, tq, 1, dtype=torch.float64)  # 1 on real queries: pads' outputs are never used
    for r in range(R):
        real[r, :, :, : b.q_len[r]] = 1
    return q, k, v, go, real.view(R, 1, g * tq, 1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 0.06)])
@pytest.mark.parametrize("tile", [16, 64, 1024])
def test_tiled_equals_sdpa_with_the_packed_mask(monkeypatch, dtype, tol, tile):
    monkeypatch.setattr(tiled_attention, "TILE", tile)  # 16, 64: many tiles and a ragged last one; 1024: one tile
    b = packed_forward.pack_pairs(PAIRS, 0)
    hkv, g, d = 2, 3, 16
    q, k, v, go, real = _inputs(b, hkv, g, d, dtype)
    q_, k_, v_ = (t.to(dtype).requires_grad_() for t in (q, k, v))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=packed_forward._dense_mask(b, g, torch.float64))
    want = torch.autograd.grad((ref * go * real).sum(), (q, k, v))
    out = tiled_attention.tiled_attention(q_, k_, v_, b.q_len, b.kv_len, g)
    got = torch.autograd.grad((out * go.to(dtype) * real.to(dtype)).sum(), (q_, k_, v_))
    err = ((out.double() - ref) * real).abs().max().item()
    assert err < tol, f"output differs by {err}"
    for name, a, w in zip("qkv", got, want):
        e = (a.double() - w).abs().max().item() / max(1.0, w.abs().max().item())
        assert e < tol, f"d{name} differs by {e} (relative to its largest entry)"


def test_long_rows_skip_the_dense_mask_and_attend_alike(monkeypatch):
    b = packed_forward.pack_pairs(PAIRS, 0)
    g = 3
    R, tq = b.q_index.shape
    assert not worth_tiling(R, g * tq, b.kv_index.shape[1])
    monkeypatch.setattr(tiled_attention, "DENSE_ELEMENTS", 0)
    assert worth_tiling(R, g * tq, b.kv_index.shape[1]) and packed_forward._sdpa_mask(b, g, torch.float32) is None
    q, k, v, _, real = _inputs(b, 2, g, 8, torch.float32)
    q, k, v = q.float(), k.float(), v.float()
    dense = packed_sdpa(q, k, v, b.q_len, b.kv_len, g, packed_forward._dense_mask(b, g, torch.float32))
    tiled = packed_sdpa(q, k, v, b.q_len, b.kv_len, g, None)
    assert ((dense - tiled) * real.float()).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 0.06)])
def test_long_whole_rows_take_the_causal_kernel_and_shared_prompts_the_tiles(monkeypatch, dtype, tol):
    """Past the dense mask's bound, rows whose every key is a query (pack_pairs: three rows of
    299, 86 and 209 tokens, padded) go to SDPA's causal kernel, a shared prompt's rows (queries
    fewer than keys) to the tiles; each equals fp64 SDPA with the packed mask on the real
    queries, forward and backward."""
    monkeypatch.setattr(tiled_attention, "DENSE_ELEMENTS", 0)
    calls = []
    for name in ("causal_rows", "tiled_attention"):
        real_fn = getattr(tiled_attention, name)
        monkeypatch.setattr(tiled_attention, name, lambda *a, _f=real_fn, _n=name: calls.append(_n) or _f(*a))
    hkv, g, d = 2, 3, 16
    for b, path in ((packed_forward.pack_pairs(PAIRS, 0), "causal_rows"),
                    (packed_forward.pack_shared(list(range(40)), [list(range(30)), list(range(7))], 0), "tiled_attention")):
        q, k, v, go, real = _inputs(b, hkv, g, d, dtype)
        ref = F.scaled_dot_product_attention(*(t.requires_grad_() for t in (q, k, v)),
                                             attn_mask=packed_forward._dense_mask(b, g, torch.float64))
        want = torch.autograd.grad((ref * go * real).sum(), (q, k, v))
        q_, k_, v_ = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
        calls.clear()
        out = packed_sdpa(q_, k_, v_, b.q_len, b.kv_len, g, packed_forward._sdpa_mask(b, g, dtype))
        assert calls == [path] and out.dtype == dtype
        got = torch.autograd.grad((out.double() * go * real).sum(), (q_, k_, v_))
        err = ((out.double() - ref.detach()) * real).abs().max().item()
        assert err < tol, f"{path}: output differs by {err}"
        for name, a, w in zip("qkv", got, want):
            e = (a.double() - w).abs().max().item() / max(1.0, w.abs().max().item())
            assert e < tol, f"{path}: d{name} differs by {e} (relative to its largest entry)"


def test_packed_logprobs_with_tiles_equal_the_dense_path(monkeypatch):
    """The whole packed forward (fp32 native layout kernels and all) with attention tiled equals it dense."""
    from longhaul.models.loader import load_policy
    from longhaul.rl.logprobs import completion_logprobs

    model, tok = load_policy("tiny-llama")
    pairs = [(p[:20], c[:40]) for p, c in PAIRS]

    def run():
        model.zero_grad(set_to_none=True)
        lp, mask, _ = completion_logprobs(model, pairs, tok.pad_token_id, fast=True)
        (lp * mask).sum().backward()
        return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    dense = run()
    monkeypatch.setattr(tiled_attention, "DENSE_ELEMENTS", 0)
    monkeypatch.setattr(tiled_attention, "TILE", 8)
    tiled = run()
    assert (dense[0] - tiled[0]).abs().max().item() < 1e-5
    for n, gr in dense[1].items():
        rel = ((gr - tiled[1][n]).norm() / gr.norm().clamp(min=1e-12)).item()
        assert rel < 1e-4, f"{n}: relative grad error {rel}"


def test_under_autocast_mixed_inputs_attend_in_the_autocast_dtype():
    """Under bf16 autocast RoPE hands over fp32 q, k beside a bf16 v: all three attend in bf16,
    forward and the recomputing backward alike, within bf16 rounding of fp64."""
    b = packed_forward.pack_pairs(PAIRS, 0)
    g = 3
    q, k, v, go, real = _inputs(b, 2, g, 16, torch.float64)
    ref = F.scaled_dot_product_attention(*(t.requires_grad_() for t in (q, k, v)), attn_mask=packed_forward._dense_mask(b, g, torch.float64))
    want = torch.autograd.grad((ref * go * real).sum(), (q, k, v))
    q_, k_, v_ = q.detach().float().requires_grad_(), k.detach().float().requires_grad_(), v.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tiled_attention.tiled_attention(q_, k_, v_, b.q_len, b.kv_len, g)
    assert out.dtype == torch.bfloat16
    got = torch.autograd.grad((out.double() * go * real).sum(), (q_, k_, v_))
    assert ((out.double() - ref.detach()) * real).abs().max().item() < 0.06
    for name, a, w in zip("qkv", got, want):
        e = (a.double() - w).abs().max().item() / max(1.0, w.abs().max().item())
        assert e < 0.06, f"d{name} differs by {e} (relative to its largest entry)"
