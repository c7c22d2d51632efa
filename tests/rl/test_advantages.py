import statistics

import pytest
import torch

from longhaul.errors import LonghaulError
from longhaul.rl.advantages import ADVANTAGES


def _loop(name, rows, eps):
    out = []
    for row in rows:
        n, mean = len(row), sum(row) / len(row)
        if name == "grpo":
            std = statistics.stdev(row)
            out.append([(r - mean) / (std + eps) for r in row])
        elif name == "dr_grpo":
            out.append([r - mean for r in row])
        elif name == "rloo":
            out.append([r - (sum(row) - r) / (n - 1) for r in row])
    return out


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("shape", [(1, 2), (4, 8), (7, 3)])
def test_estimator_matches_plain_loop(name, shape):
    g = torch.Generator().manual_seed(hash((name, shape)) % 1000)
    rewards = torch.randn(shape, generator=g, dtype=torch.float64)
    rewards[0, 0] = 1.0  # include some binary-looking values
    got = ADVANTAGES.get_fn(name)(rewards, eps=1e-4) if name == "grpo" else ADVANTAGES.get_fn(name)(rewards)
    want = torch.tensor(_loop(name, rewards.tolist(), 1e-4), dtype=torch.float64)
    diff = (got - want).abs().max().item()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-8), f"max diff {diff}"


def test_grpo_equal_rewards_give_zero_advantage():
    adv = ADVANTAGES.get_fn("grpo")(torch.ones(3, 4))
    assert torch.equal(adv, torch.zeros(3, 4))


def test_unknown_estimator_suggests():
    with pytest.raises(LonghaulError, match="did you mean 'grpo'"):
        ADVANTAGES.get_fn("grp")


def _turn_loop(rewards, lengths, gamma):
    """Plain-Python turn-level advantages: return-to-go minus the leave-one-out same-turn mean."""
    G, N = len(rewards), len(rewards[0])
    out = []
    for g in range(G):
        rets = []
        for n in range(N):
            r, ret, running = rewards[g][n], [], 0.0
            for k in reversed(range(lengths[g][n])):
                running = r[k] + gamma * running
                ret.insert(0, running)
            rets.append(ret)
        rows = []
        for n in range(N):
            row = []
            for k in range(lengths[g][n]):
                others = [rets[m][k] for m in range(N) if m != n and lengths[g][m] > k]
                base = sum(others) / len(others) if others else sum(rets[m][0] for m in range(N) if m != n) / (N - 1)
                row.append(rets[n][k] - base)
            rows.append(row)
        out.append(rows)
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_turn_level_matches_plain_loop_with_uneven_turn_counts(gamma):
    g = torch.Generator().manual_seed(3)
    G, N, K = 3, 5, 6
    lengths = torch.randint(1, K + 1, (G, N), generator=g)
    lengths[0, 0] = K  # one episode alone at the deepest turns
    mask = (torch.arange(K)[None, None, :] < lengths[..., None]).double()
    rewards = torch.randn(G, N, K, generator=g, dtype=torch.float64) * mask
    got = ADVANTAGES.get_fn("turn_level")(rewards, mask, gamma=gamma)
    want = _turn_loop(rewards.tolist(), lengths.tolist(), gamma)
    for gi in range(G):
        for n in range(N):
            L = int(lengths[gi, n])
            row = got[gi, n, :L]
            assert torch.allclose(row, torch.tensor(want[gi][n], dtype=torch.float64), rtol=1e-5, atol=1e-9), (gi, n)
            assert torch.all(got[gi, n, L:] == 0)


def test_turn_level_baseline_never_depends_on_the_episode_itself():
    """The unbiasedness condition: episode n's baseline (return minus advantage) is unchanged
    when n's own rewards and number of turns change."""
    g = torch.Generator().manual_seed(4)
    G, N, K = 2, 4, 5
    mask = torch.ones(G, N, K, dtype=torch.float64)
    mask[:, 1, 3:] = 0
    rewards = torch.randn(G, N, K, generator=g, dtype=torch.float64) * mask
    fn = ADVANTAGES.get_fn("turn_level")

    def baseline(r, m):
        adv = fn(r, m)
        ret = torch.flip(torch.cumsum(torch.flip(r * m, [-1]), -1), [-1]) * m
        return (ret - adv) * m

    b0 = baseline(rewards, mask)
    r2, m2 = rewards.clone(), mask.clone()
    r2[:, 2] = torch.randn(G, K, generator=g, dtype=torch.float64) * 10
    m2[:, 2, 2:] = 0  # episode 2 now ends after two turns
    r2 = r2 * m2
    b1 = baseline(r2, m2)
    assert torch.allclose(b0[:, 2] * m2[:, 2], b1[:, 2], atol=1e-12)
