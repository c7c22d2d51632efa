import copy

import pytest
import torch

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.models import load_policy
from longhaul.rl.grpo import GRPOTrainer
from longhaul.rl.logprobs import completion_logprobs, shared_prompt_logprobs
from longhaul.types import Trajectory, Turn


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_shared_prompt_matches_separate_sequences_values_and_grads(name):
    model, tok = load_policy(name)
    prompt = tok("<|im_start|>user\nhello there friend<|im_end|>\n").input_ids
    comps = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18], [19]]
    lp1, m1, _ = completion_logprobs(model, [(prompt, c) for c in comps], tok.pad_token_id, 0.7)
    lp1.sum().backward()
    g1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    lp2, m2, _ = shared_prompt_logprobs(model, prompt, comps, tok.pad_token_id, 0.7)
    lp2.sum().backward()
    assert torch.equal(m1, m2)
    diff = (lp1 - lp2).abs().max().item()
    assert diff < 1e-5, f"logprob max diff {diff}"
    for n, p in model.named_parameters():
        rel = ((g1[n] - p.grad).abs().max() / g1[n].abs().max().clamp(min=1e-12)).item()
        assert rel < 1e-4, f"{n}: relative grad diff {rel}"


def _groups(tok, n_groups=3, size=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = []
    for k in range(n_groups):
        prompt = tok(f"<|im_start|>user\nprompt number {k}<|im_end|>\n").input_ids
        group = []
        for j in range(size):
            n = int(torch.randint(1, 9, (1,), generator=g))
            ids = torch.randint(3, 200, (n,), generator=g).tolist()
            turn = Turn(prompt, ids, [-1.0] * n, [0] * n, [1] * n)
            group.append(Trajectory([turn], float(torch.rand((), generator=g) > 0.5) if j else float(j == 0), k))
        groups.append(group)
    return groups


@pytest.mark.parametrize("share_prompt", [True, False])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_accumulation_equals_full_batch(share_prompt, aggregation):
    base, tok = load_policy("tiny-llama")
    groups = _groups(tok)
    params = []
    for mb in (1, 16):
        model = copy.deepcopy(base)
        algo = AlgoConfig(kl_coef=0.05, aggregation=aggregation)
        trainer = GRPOTrainer(model, tok.pad_token_id, algo, TrainConfig(micro_batch=mb, autocast="none", share_prompt=share_prompt, lr=1e-3))
        # SGD at lr 1: the step is the clipped gradient, so the runs differ by its rounding (<= 1.2e-7
        # on torch's AVX-512, AVX2 and scalar kernels). Adam's first step, lr * g / (|g| + eps),
        # turns rounding in near-zero gradients into up to 5.5e-6 of the 1e-5 below, by host
        trainer.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda _: 1.0)
        m = trainer.step(groups)
        assert m["num_trained_seqs"] > 0 and m["grad_norm"] > 0
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for n in params[0]:
        diff = (params[0][n] - params[1][n]).abs().max().item()
        assert diff < 1e-5, f"{n}: max diff {diff}"


def test_kl_zero_loads_no_reference_and_equal_groups_are_skipped():
    model, tok = load_policy("tiny-llama")
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.0), TrainConfig(autocast="none"))
    assert trainer.ref is None
    groups = _groups(tok)
    for t in groups[0]:
        t.reward = 1.0
    informative = [g for g in groups if len({t.reward for t in g}) > 1]
    m = trainer.step(groups)
    assert m["frac_reward_zero_std"] == pytest.approx(1 - len(informative) / len(groups))
    assert m["num_trained_seqs"] == sum(len(g) for g in informative)


def test_token_logprobs_and_entropy_match_softmax_reference():
    from longhaul.rl.logprobs import _token_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 11, (2, 3), generator=g)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    logp, _, ent = _token_logprobs(logits, targets, mask, temperature=0.5, with_entropy=True)
    ref_all = torch.log_softmax(logits / 0.5, -1)
    want = ref_all.gather(-1, targets[..., None]).squeeze(-1) * mask
    want_ent = -(ref_all.exp() * ref_all).sum(-1) * mask
    # computed in float32 (logits are upcast from bf16 there), so float32 tolerances: both are
    # differences against logsumexp(logits / T) (up to ~19 here), so their error is a few fp32
    # ulps of that scale whatever the result's size (the entropy, < 1, measured 0.7-1.3 eps of it
    # on torch's AVX-512, AVX2 and scalar kernels); atol 8 eps of it
    tol = 8 * torch.finfo(torch.float32).eps * (logits / 0.5).abs().max().item()
    torch.testing.assert_close(logp, want, rtol=0, atol=tol)
    torch.testing.assert_close(ent, want_ent, rtol=0, atol=tol)


@pytest.mark.parametrize("overrides", [{"loss": "dual_clip"}, {"loss": "gspo", "aggregation": "seq-mean-token-mean"},
                                       {"entropy_coef": 0.01}, {"tis_cap": 2.0}, {"advantage": "rloo"}, {"advantage": "dr_grpo"}])
def test_variants_train_and_change_parameters(overrides):
    model, tok = load_policy("tiny-llama")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(**overrides), TrainConfig(autocast="none", lr=1e-3))
    m = trainer.step(_groups(tok))
    assert m["grad_norm"] > 0 and torch.isfinite(torch.tensor(m["loss"]))
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_dapo_overlong_shaping_and_truncation_mask():
    model, tok = load_policy("tiny-llama")
    groups = _groups(tok)
    for g in groups:
        for t in g:
            t.reward = 1.0  # equal rewards: only the length penalty can create a signal
    groups[0][0].turns[0].finish_reason = "length"
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(overlong_buffer=6, kl_coef=0.0), TrainConfig(autocast="none"), max_new_tokens=8)
    rewards, std, trajs, advs, sizes = trainer.select(groups)
    lens = torch.tensor([[t.completion_len for t in g] for g in groups], dtype=torch.float32)
    want = 1.0 - ((lens - 2).clamp(min=0) / 6).clamp(max=1)
    assert torch.allclose(rewards, want)
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(mask_truncated=True, drop_zero_std_groups=False, kl_coef=0.0),
                          TrainConfig(autocast="none"))
    _, _, trajs, advs, sizes = trainer.select(groups)
    assert groups[0][0] not in trajs and len(trajs) == 11 and sum(sizes) == 11 and len(advs) == 11


def test_non_finite_gradient_stops_with_a_clear_error():
    from longhaul.errors import LonghaulError

    model, tok = load_policy("tiny-llama")
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.0), TrainConfig(autocast="none"))
    with pytest.raises(LonghaulError, match="non-finite gradient"):
        trainer.step(_groups(tok))


@pytest.mark.parametrize("advantage", ["grpo", "turn_level"])
def test_negative_weight_scales_only_the_advantages_below_the_baseline(advantage):
    model, tok = load_policy("tiny-llama")
    groups = _groups(tok)
    full = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(advantage=advantage, kl_coef=0.0), TrainConfig(autocast="none"))
    _, _, _, want, _ = full.select(groups)
    for w in (0.0, 0.25):
        trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(advantage=advantage, kl_coef=0.0, negative_weight=w),
                              TrainConfig(autocast="none"))
        _, _, _, got, _ = trainer.select(groups)
        flat_want, flat_got = [a for row in want for a in row], [a for row in got for a in row]
        assert any(a < 0 for a in flat_want) and any(a > 0 for a in flat_want)
        assert flat_got == [a * w if a < 0 else a for a in flat_want]
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(advantage=advantage, kl_coef=0.0, negative_weight=0.0),
                          TrainConfig(autocast="none", lr=1e-3))
    assert trainer.step(groups)["grad_norm"] > 0  # the samples above the baseline still train


def test_a_step_without_signal_advances_the_schedule_quietly():
    import warnings

    model, tok = load_policy("tiny-llama")
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(), TrainConfig(autocast="none", lr=1e-3, warmup_steps=4))
    flat = [[Trajectory(t.turns, 1.0, t.group) for t in group] for group in _groups(tok)]  # every reward equal
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's scheduler-before-optimizer warning would fail here
        m = trainer.step(flat)
    assert m["num_trained_seqs"] == 0 and m["grad_norm"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-3 * 2 / 4)  # the warm-up went on by one step
