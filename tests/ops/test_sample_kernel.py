"""The native sampler (`csrc/sample.cpp`): the argmax, the log-normaliser and the inverse-CDF
draw of fp32 logits, checked against fp64 sums of exact weights, and `sampling.sample` on it."""

import math

import pytest
import torch

from longhaul.inference.sampling import SamplingParams, sample


def _logits(b, v, seed, banned=0.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, v, generator=gen) * 3
    if banned:
        x[torch.rand(b, v, generator=gen) < banned] = float("-inf")
    return x


@pytest.mark.parametrize("v", [49152, 1000, 7, 256])
def test_greedy_rows_take_the_first_max_and_the_log_normaliser(native, v):
    x = _logits(3, v, v, banned=0.3)
    x[1, 5 % v] = x[1, (v - 1)] = x[1].max() + 1  # a tie: the first index wins
    tokens, lse = native.sample_rows(x, torch.full((3,), -1.0, dtype=torch.float64))
    assert tokens.tolist() == [int(x[0].argmax()), 5 % v, int(x[2].argmax())]
    torch.testing.assert_close(lse.double(), torch.logsumexp(x.double(), -1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("v", [49152, 1000, 300])
def test_draws_land_where_the_fp64_cdf_puts_the_uniform(native, v):
    x = _logits(1, v, 7 + v, banned=0.2)
    w = torch.exp(x[0].double() - x[0].max().double())
    cdf = torch.cumsum(w, 0)
    total = cdf[-1].item()
    us = torch.linspace(0, 1, 401, dtype=torch.float64)[:-1]
    for u in us.tolist():
        t = int(native.sample_rows(x, torch.tensor([u], dtype=torch.float64))[0])
        assert w[t] > 0, "a banned (weight 0) token was drawn"
        lo, hi = (cdf[t - 1].item() if t else 0.0), cdf[t].item()
        slack = 1e-6 * total  # fp32 exp and fp32 chunk sums against exact fp64 weights
        assert lo - slack <= u * total <= hi + slack, (u, t)


def test_the_edges_of_the_uniform_never_draw_a_zero_weight(native):
    x = torch.full((2, 1000), float("-inf"))
    x[0, 3], x[0, 999] = 0.0, 1.0
    x[1, 500] = 2.0
    for u in (0.0, 1 - 2 ** -52):
        tokens, _ = native.sample_rows(x, torch.tensor([u, u], dtype=torch.float64))
        assert tokens[1] == 500 and tokens[0] in (3, 999)
    assert native.sample_rows(x, torch.tensor([0.0, 0.0], dtype=torch.float64))[0][0] == 3
    assert native.sample_rows(x, torch.tensor([1 - 2 ** -52, 0.0], dtype=torch.float64))[0][0] == 999


def test_draw_frequencies_match_the_softmax(native):
    x = torch.tensor([[0.0, 1.0, 2.0, float("-inf"), -1.0] + [-30.0] * 600])
    p = torch.softmax(x[0].double(), 0)
    n = 20000
    u = torch.rand(n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    counts = torch.zeros(x.shape[1])
    for i in range(n):
        counts[int(native.sample_rows(x, u[i:i + 1])[0])] += 1
    assert counts[3] == 0
    for j in range(5):  # within 5 standard deviations of n * p
        assert abs(counts[j] - n * p[j]) <= 5 * math.sqrt(n * p[j] * (1 - p[j])) + 1


def test_sample_on_the_kernel_returns_logprobs_of_the_processed_distribution(native):
    x = _logits(4, 3000, 11)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, seed=1),
              SamplingParams(temperature=1.0, top_k=20, seed=2), SamplingParams(temperature=1.0, seed=3)]
    gens = [torch.Generator().manual_seed(p.seed or 0) for p in params]
    out = sample(x.clone(), params, gens, [[], [], [int(x[2].argmax())], []])
    assert out.token_ids[0] == int(x[0].argmax())
    assert out.token_ids[2] != int(x[2].argmax())  # banned
    assert out.token_ids[2] in x[2].topk(21).indices.tolist()
    scaled = torch.log_softmax(x[1].double() / 0.7, 0)
    assert out.logprobs[1] == pytest.approx(scaled[out.token_ids[1]].item(), abs=1e-5)
    assert out.logprobs[3] == pytest.approx(torch.log_softmax(x[3].double(), 0)[out.token_ids[3]].item(), abs=1e-5)
    # seeded draws repeat whatever shares the batch
    again = sample(x[1:2].clone(), params[1:2], [torch.Generator().manual_seed(1)], [[]])
    assert again.token_ids[0] == out.token_ids[1]


def test_bad_shapes_are_refused(native):
    with pytest.raises(RuntimeError, match="one uniform per row"):
        native.sample_rows(torch.zeros(2, 5), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"\(B, V\) fp32"):
        native.sample_rows(torch.zeros(2, 5, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
