import math

import torch

from longhaul.rl.advantages import ADVANTAGES
from longhaul.rl.losses import POLICY_LOSSES, AdaptiveKL, aggregate, kl_reward_penalty, truncated_is_weight


def _r(shape, seed, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def test_gae_matches_plain_loop():
    B, T, gamma, lam = 4, 7, 0.99, 0.9
    rewards, values = _r((B, T), 1), _r((B, T), 2)
    lens = [7, 3, 1, 5]
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lens], dtype=torch.float64)
    adv, ret = ADVANTAGES.get_fn("gae")(rewards, values, mask, gamma, lam)
    for b, n in enumerate(lens):
        last = 0.0
        for t in reversed(range(n)):
            nv = values[b, t + 1].item() if t + 1 < n else 0.0
            delta = rewards[b, t].item() + gamma * nv - values[b, t].item()
            last = delta + gamma * lam * last
            assert abs(adv[b, t].item() - last) < 1e-10
            assert abs(ret[b, t].item() - (last + values[b, t].item())) < 1e-10
        assert (adv[b, n:] == 0).all()


def test_reinforce_pp_matches_loop():
    r = _r((3, 4), 3)
    got = ADVANTAGES.get_fn("reinforce_pp")(r)
    centred = [[x - sum(row) / len(row) for x in row] for row in r.tolist()]
    flat = [x for row in centred for x in row]
    m = sum(flat) / len(flat)
    sd = math.sqrt(sum((x - m) ** 2 for x in flat) / (len(flat) - 1))
    want = torch.tensor([[(x - m) / (sd + 1e-6) for x in row] for row in centred], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-5)


def test_dual_clip_matches_plain_loop():
    logp, old, adv = _r((5, 6), 4, 0.8), _r((5, 6), 5, 0.8), _r((5,), 6)
    loss, _ = POLICY_LOSSES.get_fn("dual_clip")(logp, old, adv, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    for b in range(5):
        for t in range(6):
            r, a = math.exp(logp[b, t] - old[b, t]), adv[b].item()
            obj = min(r * a, min(max(r, 0.8), 1.28) * a)
            if a < 0:
                obj = max(obj, 3.0 * a)
            assert abs(loss[b, t].item() + obj) < 1e-9


def test_gspo_value_and_gradient_equal_the_sequence_level_objective():
    B, T = 3, 5
    old, adv = _r((B, T), 7, 0.01), _r((B,), 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
    logp = (old + _r((B, T), 9, 1e-5)).requires_grad_()  # tiny ratios: inside the clip range
    loss, _ = POLICY_LOSSES.get_fn("gspo")(logp, old, adv, clip_low=3e-4, clip_high=4e-4, mask=mask)
    agg = aggregate(loss, mask, "seq-mean-token-mean", mask.sum().item(), B)
    agg.backward()
    g1 = logp.grad.clone()
    logp2 = logp.detach().clone().requires_grad_()
    s = torch.exp(((logp2 - old) * mask).sum(-1) / mask.sum(-1))
    ref = -(torch.minimum(s * adv, torch.clamp(s, 1 - 3e-4, 1 + 4e-4) * adv)).sum() / B
    ref.backward()
    assert abs(agg.item() - ref.item()) < 1e-9
    assert torch.allclose(g1, logp2.grad, atol=1e-9)


def test_tis_weight_kl_penalty_and_adaptive_kl():
    w = truncated_is_weight(torch.tensor([0.0, 2.0, -1.0]), torch.tensor([0.0, 0.0, 0.0]), cap=2.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, math.exp(-1.0)]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    tr = kl_reward_penalty(torch.tensor([1.0, -1.0]), torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.0, 0.0]]),
                           torch.zeros(2, 3), mask, coef=0.1)
    assert torch.allclose(tr, torch.tensor([[-0.01, 1.0 - 0.02, 0.0], [-1.0 - 0.05, 0.0, 0.0]]))
    k = AdaptiveKL(0.1, target=0.05, horizon=100)
    assert k.update(0.5, 10) > 0.1 and AdaptiveKL(0.1, 0.05, 100).update(0.0, 10) < 0.1


def test_clipped_value_loss_matches_loop():
    from longhaul.rl.losses import clipped_value_loss

    v, vo, R = _r((3, 4), 10), _r((3, 4), 11), _r((3, 4), 12)
    mask = torch.ones(3, 4, dtype=torch.float64)
    got = clipped_value_loss(v, vo, R, mask, clip=0.2)
    for b in range(3):
        for t in range(4):
            x, xo, r = v[b, t].item(), vo[b, t].item(), R[b, t].item()
            vc = xo + max(-0.2, min(0.2, x - xo))
            assert abs(got[b, t].item() - 0.5 * max((x - r) ** 2, (vc - r) ** 2)) < 1e-12


def test_overlong_penalty_is_soft_then_full():
    from longhaul.rl.losses import overlong_penalty

    got = overlong_penalty(torch.tensor([10, 96, 112, 128, 200]), max_len=128, buffer=32)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))


def test_off_policy_weights_tis_and_decoupled_against_a_loop():
    from longhaul.rl.losses import off_policy_weight

    prox, beh = _r((3, 5), 7, 0.5), _r((3, 5), 8, 0.5)
    tis = off_policy_weight("tis", prox, beh, 1.5)
    dec = off_policy_weight("decoupled", prox, beh, 1.5)
    free = off_policy_weight("decoupled", prox, beh, None)
    assert off_policy_weight("tis", prox, beh, None) is None  # no cap: TIS is off
    for b in range(3):
        for t in range(5):
            r = math.exp(prox[b, t].item() - beh[b, t].item())
            assert abs(tis[b, t].item() - min(r, 1.5)) < 1e-12
            assert abs(dec[b, t].item() - (r if r <= 1.5 else 0.0)) < 1e-12  # over the cap: dropped, not truncated
            assert abs(free[b, t].item() - r) < 1e-12


def test_decoupled_ppo_gradient_is_the_importance_weighted_policy_gradient():
    """Inside the clip region, d/dlogp of w * ppo_clip(logp, prox, A) is -w * A / n per token."""
    from longhaul.rl.losses import off_policy_weight

    logp = _r((2, 4), 11, 0.1).requires_grad_()
    prox, beh, adv = logp.detach().clone(), logp.detach() + _r((2, 4), 12, 0.2), _r((2, 4), 13)
    mask = torch.ones(2, 4, dtype=torch.float64)
    w = off_policy_weight("decoupled", prox, beh, None)
    tok, _ = POLICY_LOSSES.get_fn("ppo_clip")(logp, prox, adv, clip_low=0.2, clip_high=0.2, mask=mask)
    aggregate(tok * w, mask, "token-mean", 8.0, 2.0).backward()
    expect = -w * adv / 8.0
    assert (logp.grad - expect).abs().max() < 1e-12, (logp.grad - expect).abs().max()
