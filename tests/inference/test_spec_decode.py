import pytest
import torch

from longhaul.inference.spec_decode import (
    NgramProposer,
    SpecCounters,
    acceptance_prob,
    greedy_verify,
    rejection_sample,
    residual,
)

V = 5
# chi-square critical values at alpha = 1e-4 by degrees of freedom (mpmath: gammaincc(df/2, x/2) = 1e-4)
CHI2_CRIT = {1: 15.137, 2: 18.421, 3: 21.108, 4: 23.513}


def _dist(gen, n=V, zeros=0):
    """A random distribution over n tokens with `zeros` forced-zero entries, float64."""
    w = -torch.rand(n, generator=gen, dtype=torch.float64).log()  # Dirichlet(1)
    if zeros:
        w[torch.randperm(n, generator=gen)[:zeros]] = 0
    return w / w.sum()


def _first_token_law(p, q):
    """Exact law of the token emitted at a position with draft law q and target p, from the
    library's own pieces: q(y) a(y) + (1 - sum_x q(x) a(x)) residual(y)."""
    xs = torch.arange(len(p))
    a = acceptance_prob(p.expand(len(p), -1), q.expand(len(p), -1), xs)
    kept = q * a
    return kept + (1 - kept.sum()) * residual(p, q)


@pytest.mark.parametrize("p_zeros,q_zeros", [(0, 0), (2, 0), (0, 2), (1, 3)])
def test_accept_then_residual_reproduces_the_target_exactly(p_zeros, q_zeros):
    gen = torch.Generator().manual_seed(p_zeros * 10 + q_zeros)
    worst = 0.0
    for _ in range(50):
        p, q = _dist(gen, zeros=p_zeros), _dist(gen, zeros=q_zeros)
        worst = max(worst, (_first_token_law(p, q) - p).abs().max().item())
    assert worst < 1e-6, f"max |P(out) - p| = {worst:.3g}"


def test_identical_draft_and_target_never_reject():
    p = _dist(torch.Generator().manual_seed(0))
    a = acceptance_prob(p.expand(V, -1), p.expand(V, -1), torch.arange(V))
    assert torch.equal(a, torch.ones(V, dtype=p.dtype))
    assert (_first_token_law(p, p) - p).abs().max().item() < 1e-12
    assert torch.equal(residual(p, p), p)  # empty residual falls back to a distribution


def test_one_hot_draft_reproduces_the_target_exactly():
    """A deterministic proposer (n-gram): q = one-hot(x), accepted with probability p(x)."""
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for zeros in (0, 2):
        for _ in range(20):
            p = _dist(gen, zeros=zeros)
            for x in range(V):
                q = torch.nn.functional.one_hot(torch.tensor(x), V).double()
                a = acceptance_prob(p, None, torch.tensor(x))
                assert a.item() == pytest.approx(acceptance_prob(p, q, torch.tensor(x)).item(), abs=1e-15)
                law = a * q + (1 - a) * residual(p, q)
                worst = max(worst, (law - p).abs().max().item())
    assert worst < 1e-6, f"max |P(out) - p| = {worst:.3g}"


def _markov_batch(B, k, seed, one_hot_draft=False):
    """Draft and target are Markov chains over V tokens (p_j depends on the previous draft
    token, as a real target scores after the drafted prefix). Returns the rejection_sample
    inputs plus the chains (p0, T) of the target and (q0, Tq) of the draft."""
    gen = torch.Generator().manual_seed(seed)
    p0 = _dist(gen, zeros=1)
    T = torch.stack([_dist(gen, zeros=1) for _ in range(V)])
    q0 = _dist(gen)
    Tq = torch.stack([_dist(gen) for _ in range(V)])
    x = torch.empty((B, k), dtype=torch.long)
    draft_probs = torch.empty((B, k, V), dtype=torch.float64)
    target_probs = torch.empty((B, k + 1, V), dtype=torch.float64)
    target_probs[:, 0] = p0
    q = q0.expand(B, -1)
    for j in range(k):
        draft_probs[:, j] = q
        x[:, j] = torch.multinomial(q, 1, generator=gen).squeeze(-1)
        q = Tq[x[:, j]]
        target_probs[:, j + 1] = T[x[:, j]]
    if one_hot_draft:
        draft_probs = None
    return x, draft_probs, target_probs, (p0, T), (q0, Tq)


def _chi2(counts, probs, strict=True):
    """Pearson statistic over the categories with probs > 0 and its degrees of freedom;
    `strict` also asserts nothing was emitted where probs == 0."""
    counts, probs = counts.double(), probs.double()
    if strict:
        assert counts[probs == 0].sum() == 0, f"emitted a zero-probability token: {counts.tolist()}"
    keep = probs > 0
    n = counts.sum()
    exp = n * probs[keep]
    assert exp.min() >= 5, "too few rows for a chi-square test"
    return (((counts[keep] - exp) ** 2) / exp).sum().item(), int(keep.sum()) - 1


@pytest.mark.parametrize("one_hot_draft", [False, True])
def test_emitted_tokens_follow_the_target_statistically(one_hot_draft):
    B, k = 200_000, 3
    x, dq, tp, (p0, T), (q0, Tq) = _markov_batch(B, k, seed=7, one_hot_draft=one_hot_draft)
    out, n_acc = rejection_sample(x, dq, tp, torch.Generator().manual_seed(0))
    report = []

    stat, df = _chi2(torch.bincount(out[:, 0], minlength=V), p0)
    report.append(("pos0", stat, df))
    for j in range(1, k + 1):  # given out_{j-1} = a and position j emitted, out_j ~ T[a]
        for a in range(V):
            rows = (out[:, j] >= 0) & (out[:, j - 1] == a)
            if rows.sum() * T[a][T[a] > 0].min() < 5:  # too few rows for chi-square's approximation
                continue
            stat, df = _chi2(torch.bincount(out[rows, j], minlength=V), T[a])
            report.append((f"pos{j}|{a}", stat, df))

    # number accepted: exact law by forward recursion over the accepted prefix
    m = torch.minimum(p0, q0) if not one_hot_draft else q0 * p0  # P(x_0 = a, accepted)
    tail = [m.sum()]
    for _ in range(1, k):
        step = torch.minimum(T, Tq) if not one_hot_draft else Tq * T
        m = m @ step
        tail.append(m.sum())
    p_ge = torch.tensor([1.0] + [t.item() for t in tail] + [0.0], dtype=torch.float64)
    law = p_ge[:-1] - p_ge[1:]  # P(N = 0..k)
    stat, df = _chi2(torch.bincount(n_acc, minlength=k + 1), law)
    report.append(("num_accepted", stat, df))

    worst = max(report, key=lambda r: r[1] / CHI2_CRIT[r[2]])
    print(f"{len(report)} chi-square tests (name, stat, df):", [(name, round(s, 2), d) for name, s, d in report])
    assert len(report) >= 12
    assert all(s < CHI2_CRIT[d] for _, s, d in report), f"worst {worst} vs critical {CHI2_CRIT[worst[2]]}"
    # the test has power: the unverified drafts fail it by far
    raw, df = _chi2(torch.bincount(x[:, 0], minlength=V), p0, strict=False)
    assert raw > 100 * CHI2_CRIT[df], f"raw drafts: chi-square {raw:.1f}"


def test_greedy_rows_follow_the_target_argmax_chain():
    gen = torch.Generator().manual_seed(3)
    k, B = 4, 64
    T = torch.stack([_dist(gen) for _ in range(V)])
    p0 = _dist(gen)
    chain = [int(p0.argmax())]
    for _ in range(k):
        chain.append(int(T[chain[-1]].argmax()))
    x = torch.randint(0, V, (B, k), generator=gen)
    n_right = torch.randint(0, k + 1, (B,), generator=gen)
    for b in range(B):  # first n_right[b] drafts are the argmax chain, the next one is wrong
        m = int(n_right[b])
        x[b, :m] = torch.tensor(chain[:m], dtype=torch.long)
        if m < k:
            x[b, m] = (chain[m] + 1 + int(x[b, m]) % (V - 1)) % V
    tp = torch.cat([p0.expand(B, 1, V), T[x]], dim=1)  # (B, k+1, V): p_j after the drafted prefix
    out, n_acc = greedy_verify(x, tp)
    assert torch.equal(n_acc, n_right)
    for b in range(B):
        m = int(n_right[b])
        assert out[b, : m + 1].tolist() == chain[: m + 1] and (out[b, m + 1:] == -1).all()
    # greedy rows ignore the draft probabilities and the generator, also in a mixed batch
    dq = torch.softmax(torch.randn(B, k, V, generator=gen, dtype=torch.float64), -1)
    greedy = torch.arange(B) % 2 == 0
    mixed, _ = rejection_sample(x, dq, tp, torch.Generator().manual_seed(5), greedy=greedy)
    assert torch.equal(mixed[greedy], out[greedy])


def test_short_and_empty_drafts_sample_one_plain_token():
    tp = torch.tensor([[0.0, 0.0, 1.0]]).expand(3, 3, 3).clone()  # target always says 2
    x = torch.tensor([[2, 2], [2, 0], [-1, -1]])
    out, n_acc = rejection_sample(x, None, tp, torch.Generator().manual_seed(0), draft_lens=torch.tensor([1, 2, 0]))
    assert n_acc.tolist() == [1, 1, 0]
    assert out.tolist() == [[2, 2, -1], [2, 2, -1], [2, -1, -1]]


def test_per_row_generators_make_rows_independent_of_the_batch():
    x, dq, tp, _, _ = _markov_batch(6, 3, seed=2)
    gens = lambda: [torch.Generator().manual_seed(100 + b) for b in range(6)]  # noqa: E731
    full, _ = rejection_sample(x, dq, tp, gens())
    half, _ = rejection_sample(x[3:], dq[3:], tp[3:], gens()[3:])
    assert torch.equal(full[3:], half)


def test_shape_errors_name_the_argument():
    x = torch.zeros((2, 3), dtype=torch.long)
    with pytest.raises(ValueError, match="target_probs"):
        rejection_sample(x, None, torch.rand(2, 3, 5), torch.Generator())
    with pytest.raises(ValueError, match="generator"):
        rejection_sample(x, None, torch.rand(2, 4, 5))


@pytest.mark.parametrize(
    "ids,kw,want",
    [
        ([1, 2, 3, 4, 1, 2], dict(k=2), [3, 4]),
        ([5, 9, 7, 1, 9, 8, 5, 9], dict(k=3), [7, 1, 9]),  # the 2-gram wins over a later 1-gram
        ([1, 2, 7, 1, 2, 8, 1, 2], dict(k=1), [8]),  # most recent occurrence
        ([1, 2, 3, 4], dict(k=3), []),  # no earlier occurrence
        ([1, 2, 3, 1], dict(n_min=2, k=2), []),  # only a 1-gram matches
        ([7], dict(k=2), []),
        ([], dict(k=2), []),
        ([3, 3, 3], dict(k=4), [3, 3, 3, 3]),  # a loop continues past the end
        ([1, 2, 1, 2, 1, 2], dict(k=4), [1, 2, 1, 2]),
        ([1, 2, 3, 9, 1, 2], dict(k=5), [3, 9, 1, 2, 3]),
    ],
)
def test_ngram_proposer(ids, kw, want):
    assert NgramProposer(**{"n_min": 1, "n_max": 3, **kw}).propose(ids) == want


def test_ngram_proposer_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_min"):
        NgramProposer(n_min=3, n_max=2)
    with pytest.raises(ValueError, match="k"):
        NgramProposer(k=0)


def test_counters():
    c = SpecCounters()
    assert c.acceptance_rate != c.acceptance_rate  # nan before any draft
    c.record([3, 3, 0], torch.tensor([3, 1, 0]))
    c.record([2], [0])
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (3, 8, 4)
    assert c.accepted_per_pos == [2, 1, 1]
    assert c.acceptance_rate == pytest.approx(0.5)
    assert c.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert c.as_metrics()["spec_decode_num_drafts"] == 3


def test_per_row_stream_ignores_the_batch_draft_width():
    """A row with one draft draws the same uniforms alone (k=1) as padded into a k=3 batch."""
    x, dq, tp, _, _ = _markov_batch(4, 3, seed=4)
    lens = torch.tensor([1, 3, 2, 3])
    wide, _ = rejection_sample(x, dq, tp, [torch.Generator().manual_seed(b) for b in range(4)], draft_lens=lens)
    alone, _ = rejection_sample(x[:1, :1], dq[:1, :1], tp[:1, :2], [torch.Generator().manual_seed(0)])
    assert wide[0, :2].tolist() == alone[0].tolist() and (wide[0, 2:] == -1).all()


# ---- in the engine: greedy speculative decoding is token-identical to plain greedy ----------

TEXTS = ["hello there", "a much longer prompt with several words in it, long enough for blocks", "x",
         "def fib(n):\n    return", "hello there, general kenobi"]


def _lively(name: str, noise: float = 0.0):
    """A built-in tiny model re-initialised with large weights so greedy decoding varies from
    token to token (top-1/top-2 logit gaps far above fp32 rounding); `noise` then perturbs
    every weight, giving a draft that mostly agrees with the noise-free target."""
    from longhaul.models import load_policy

    model, tok = load_policy(name)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            else:
                p.copy_(1 + torch.randn(p.shape, generator=gen) * 0.1)
        gen_noise = torch.Generator().manual_seed(99)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen_noise) * noise)
    return model.eval(), tok


@pytest.fixture(scope="module")
def target():
    model, tok = _lively("tiny-llama")
    return model, tok, [tok.encode(t) for t in TEXTS]


def _run(model, tok, prompts, params, spec=None, draft=None, **engine_kw):
    from longhaul.inference import LLMEngine
    from longhaul.inference.spec_worker import SpecDecoder

    eng = LLMEngine(model, tokenizer=tok, **{"num_kv_blocks": 64, "block_size": 4, **engine_kw})
    dec = SpecDecoder(eng, spec, draft).attach() if spec is not None else None
    return eng.generate(prompts, params), dec


def _greedy(n=32, **kw):
    from longhaul.inference.sampling import SamplingParams

    return SamplingParams(temperature=0, max_tokens=n, **kw)


def _spec(**kw):
    from longhaul.inference.spec_worker import SpeculativeConfig

    return SpeculativeConfig(**{"num_speculative_tokens": 4, **kw})


def _assert_same(got, want):
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids, f"prompt of {len(w.prompt_token_ids)} tokens"
        assert g.finish_reason == w.finish_reason
        diff = max((abs(a - b) for a, b in zip(g.logprobs, w.logprobs)), default=0.0)
        assert diff < 1e-4, f"max logprob diff {diff}"


@pytest.mark.parametrize("draft", ["perturbed", "tiny-llama-large", "ngram"])
def test_speculative_greedy_is_token_identical(target, draft):
    model, tok, prompts = target
    plain, _ = _run(model, tok, prompts, _greedy())
    if draft == "ngram":
        got, dec = _run(model, tok, prompts, _greedy(), _spec(method="ngram", ngram_min=1, ngram_max=3))
    else:
        dm = _lively("tiny-llama", noise=0.005)[0] if draft == "perturbed" else _lively("tiny-llama-large")[0]
        got, dec = _run(model, tok, prompts, _greedy(), _spec(method="draft"), dm)
    _assert_same(got, plain)
    c = dec.counters
    print(f"{draft}: drafts {c.num_drafts}, draft tokens {c.num_draft_tokens}, accepted {c.num_accepted_tokens}, "
          f"rate {c.acceptance_rate:.2f}, mean length {c.mean_acceptance_length:.2f}")
    assert c.num_drafts > 0 and c.num_accepted_tokens <= c.num_draft_tokens
    if draft == "perturbed":
        assert c.acceptance_rate > 0.5


def test_ngram_on_a_repetitive_model_accepts_most_drafts_and_stays_identical():
    from longhaul.models import load_policy

    model, tok = load_policy("tiny-llama")  # random init: greedy falls into short loops
    prompts = [tok.encode(t) for t in TEXTS]
    plain, _ = _run(model.eval(), tok, prompts, _greedy(40))
    got, dec = _run(model, tok, prompts, _greedy(40), _spec(method="ngram"))
    _assert_same(got, plain)
    assert dec.counters.acceptance_rate > 0.5, dec.counters


def test_stop_token_inside_accepted_drafts_and_max_tokens(target):
    model, tok, prompts = target
    free, _ = _run(model, tok, prompts[:1], _greedy(32))
    stop = free[0].token_ids[9]  # a token the draft will often have drafted past
    params = _greedy(30, stop_token_ids=[stop])
    plain, _ = _run(model, tok, prompts, params)
    got, _ = _run(model, tok, prompts, params, _spec(method="draft"), _lively("tiny-llama", noise=0.005)[0])
    _assert_same(got, plain)
    assert got[0].finish_reason == "stop" and got[0].token_ids[-1] == stop
    assert all(len(o.token_ids) <= 30 for o in got)


def test_identical_under_preemption_with_a_small_pool(target):
    model, tok, prompts = target
    plain, _ = _run(model, tok, prompts, _greedy())
    got, dec = _run(model, tok, prompts, _greedy(), _spec(method="draft"), _lively("tiny-llama", noise=0.005)[0],
                    num_kv_blocks=30)
    _assert_same(got, plain)
    assert dec.engine.stats()["num_preemptions_total"] > 0
    assert not dec.draft.states and dec.draft.bm.num_free_blocks == dec.draft.bm.num_blocks  # all released


def test_sampling_with_the_target_as_draft_accepts_almost_everything(target):
    """p and q differ only by fp32 rounding (decode vs chunk attention), so min(1, p/q) is ~1."""
    from longhaul.inference.sampling import SamplingParams

    model, tok, prompts = target
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seed=3, logprobs=2)
    a, dec = _run(model, tok, prompts, params, _spec(method="draft"), model)
    b, _ = _run(model, tok, prompts, params, _spec(method="draft"), model)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]  # seeded: reproducible
    assert dec.counters.acceptance_rate > 0.95, dec.counters
    for o in a:
        assert len(o.logprobs) == len(o.token_ids) == len(o.top_logprobs) and all(lp <= 0 for lp in o.logprobs)
