import math

import pytest
import torch

from longhaul.rl.losses import KL_ESTIMATORS, POLICY_LOSSES, aggregate


def _rand(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_ppo_clip_matches_plain_loop():
    B, T, lo, hi = 5, 7, 0.2, 0.28
    logp, old, adv = _rand((B, T), 1) * 0.3, _rand((B, T), 2) * 0.3, _rand((B,), 3)
    loss, clip = POLICY_LOSSES.get_fn("ppo_clip")(logp, old, adv, clip_low=lo, clip_high=hi)
    for b in range(B):
        for t in range(T):
            r = math.exp(logp[b, t] - old[b, t])
            a = adv[b].item()
            want = -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)
            assert abs(loss[b, t].item() - want) <= 1e-5 * max(1.0, abs(want)), (b, t, loss[b, t].item(), want)
            assert bool(clip["low"][b, t]) == (r < 1 - lo and a < 0)
            assert bool(clip["high"][b, t]) == (r > 1 + hi and a > 0)


def test_ppo_clip_gradient_is_policy_gradient_at_ratio_one():
    logp = _rand((3, 4), 4).requires_grad_()
    adv = _rand((3,), 5)
    loss, _ = POLICY_LOSSES.get_fn("ppo_clip")(logp, logp.detach(), adv)
    loss.sum().backward()
    assert torch.allclose(logp.grad, -adv[:, None].expand(3, 4), rtol=1e-12)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_estimators_match_formulas(name):
    logp, ref = _rand((4, 6), 6) * 0.5, _rand((4, 6), 7) * 0.5
    got = KL_ESTIMATORS.get_fn(name)(logp, ref)
    for b in range(4):
        for t in range(6):
            x, y = logp[b, t].item(), ref[b, t].item()
            want = {"k1": x - y, "k2": 0.5 * (x - y) ** 2, "k3": math.exp(y - x) - (y - x) - 1}[name]
            assert abs(got[b, t].item() - want) <= 1e-5 * max(1.0, abs(want))


def test_k3_is_nonnegative_and_zero_at_equality():
    x = _rand((10, 10), 8)
    assert (KL_ESTIMATORS.get_fn("k3")(x, x) == 0).all()
    assert (KL_ESTIMATORS.get_fn("k3")(x, _rand((10, 10), 9)) >= 0).all()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_matches_loop_and_accumulates_exactly(mode):
    vals = _rand((6, 5), 10)
    lens = [5, 3, 1, 4, 2, 5]
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in lens], dtype=torch.float64)
    n_tok, n_seq = float(sum(lens)), 6.0
    full = aggregate(vals, mask, mode, n_tok, n_seq, max_len=5)
    if mode == "token-mean":
        want = sum(vals[b, t].item() for b in range(6) for t in range(lens[b])) / n_tok
    elif mode == "seq-mean-token-mean":
        want = sum(sum(vals[b, t].item() for t in range(lens[b])) / lens[b] for b in range(6)) / n_seq
    else:
        want = sum(sum(vals[b, t].item() for t in range(lens[b])) / 5 for b in range(6)) / n_seq
    assert abs(full.item() - want) < 1e-10
    parts = sum(aggregate(vals[i:i + 2], mask[i:i + 2], mode, n_tok, n_seq, max_len=5) for i in range(0, 6, 2))
    assert abs(parts.item() - full.item()) < 1e-12
