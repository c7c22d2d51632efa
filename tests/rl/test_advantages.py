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
