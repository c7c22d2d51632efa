"""PPO: GAE over model tokens against a plain loop, KL-in-reward token rewards against a
hand-written reference, the critic's read positions, exact gradient accumulation and resume
for actor and critic, and a learning check (with its GRPO twin) on a task sampled from the
tiny model itself."""

import copy
import io

import pytest
import torch

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.models import load_policy
from longhaul.rl.logprobs import completion_logprobs
from longhaul.rl.ppo import PPOTrainer, ValueModel, model_token_gae, whiten
from longhaul.types import Trajectory, Turn

METRICS = ("reward", "reward_std", "frac_reward_zero_std", "kl", "kl_coef", "entropy", "clip_ratio/low_mean",
           "clip_ratio/high_mean", "clip_ratio/region_mean", "grad_norm", "loss", "num_tokens", "num_trained_seqs", "lr",
           "critic/value_loss", "critic/vf_clipfrac", "critic/values_mean", "critic/explained_variance", "critic/grad_norm",
           "timing/update_actor")



def _gae_loop(rewards, values, mask, gamma, lam):
    """Plain-Python GAE that visits only the mask-1 positions of each row."""
    out = []
    for r, v, m in zip(rewards, values, mask):
        steps = [t for t, x in enumerate(m) if x]
        adv, last = [0.0] * len(r), 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_v = v[steps[k + 1]] if k + 1 < len(steps) else 0.0  # the next MODEL token's value; 0 after the last
            last = r[t] + gamma * next_v - v[t] + gamma * lam * last
            adv[t] = last
        out.append(adv)
    return out


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0)])
def test_gae_over_interleaved_masks_equals_a_loop_over_model_tokens(gamma, lam):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 11, generator=g, dtype=torch.float64)
    values = torch.randn(4, 11, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0, 1, 0, 0],  # turns with environment tokens between, then padding
                         [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                         [0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0],
                         [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    adv, ret = model_token_gae(rewards * mask, values * mask, mask, gamma, lam)
    want = torch.tensor(_gae_loop(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam), dtype=torch.float64)
    diff = (adv - want).abs().max().item()
    assert torch.allclose(adv, want, rtol=1e-5, atol=1e-10), f"max diff {diff}"
    assert torch.allclose(ret, (want + values) * mask, rtol=1e-5, atol=1e-10)
    assert torch.equal(adv[mask == 0], torch.zeros_like(adv[mask == 0]))


def test_whiten_normalises_over_model_tokens_only():
    x = torch.tensor([[1.0, 100.0, 3.0], [5.0, 7.0, -50.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    w = whiten(x, mask)
    kept = w[mask > 0]
    assert abs(kept.mean().item()) < 1e-6 and abs(kept.std().item() - 1) < 1e-6
    assert torch.equal(w[mask == 0], torch.zeros(2))


def test_critic_values_are_read_at_the_state_before_each_completion_token():
    policy, tok = load_policy("tiny-llama")
    critic = ValueModel(policy)
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(0))
    pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14, 15])]
    values, mask = critic.values(pairs, tok.pad_token_id)
    assert values.shape == mask.shape == (2, 4)
    for b, (p, c) in enumerate(pairs):
        hidden = critic.backbone(input_ids=torch.tensor([p + c])).last_hidden_state[0]  # (L, H)
        for t in range(4):
            want = critic.head(hidden[len(p) - 1 + t]).item() if t < len(c) else 0.0
            # relative: values reach ~9 (a unit-normal head over 64 hidden units, |terms| summing
            # to ~50), and the padded batch and the lone sequence reach them by different GEMM
            # shapes, so they agree to a few ulps of their size (one measured), not to an absolute 1e-5
            assert abs(values[b, t].item() - want) <= 1e-5 * max(1.0, abs(want)), (b, t, values[b, t].item(), want)
    # the critic is a copy: training it leaves the policy alone
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(critic.backbone.parameters(), policy.base_model.parameters()))


def test_critic_of_a_lora_policy_is_a_full_fp32_copy_of_the_backbone():
    pytest.importorskip("peft")
    from longhaul.models.lora import apply_lora

    base, _ = load_policy("tiny-llama")
    want = {k: v.clone() for k, v in base.base_model.state_dict().items()}
    policy = apply_lora(base, 4, 16.0, 0.0, ["q_proj", "v_proj"], "tiny-llama")
    critic = ValueModel(policy)
    state = critic.backbone.state_dict()
    assert state.keys() == want.keys()
    assert all(torch.equal(state[k], want[k]) for k in want)
    assert all(p.requires_grad and p.dtype == torch.float32 for p in critic.parameters())


def _prompt(tok, k):
    return tok(f"<|im_start|>user\nprompt number {k}<|im_end|>\n<|im_start|>assistant\n").input_ids


def _groups(tok, n_groups=3, size=4, seed=0):
    """Synthetic single-turn groups with 0/1 rewards, one multi-turn trajectory (environment
    tokens between its turns) and one infra error."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for k in range(n_groups):
        prompt, group = _prompt(tok, k), []
        for j in range(size):
            n = int(torch.randint(1, 9, (1,), generator=g))
            ids = torch.randint(3, 200, (n,), generator=g).tolist()
            group.append(Trajectory([Turn(prompt, ids, [-5.0] * n, [0] * n, [1] * n)], float(torch.rand((), generator=g) > 0.5), k))
        groups.append(group)
    prompt = _prompt(tok, 0)
    obs = tok("<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n").input_ids
    turns = [Turn(prompt, [20, 21, 22], [-5.0] * 3, [0] * 3, [1] * 3), Turn(prompt + [20, 21, 22] + obs, [23, 24], [-5.0] * 2, [1] * 2, [1] * 2)]
    groups[0].append(Trajectory(turns, 1.0, 0))
    groups[1].append(Trajectory(groups[1][0].turns, 0.0, 1, {"ended": "infra_error"}))
    return groups


def _nudge(model, seed=1, scale=0.05):
    """Move the policy away from its reference so the KL is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


@pytest.mark.parametrize("kl_penalty", ["reward", "loss"])
def test_token_rewards_match_a_hand_written_reference(kl_penalty):
    policy, tok = load_policy("tiny-llama")
    coef = 0.1
    trainer = PPOTrainer(policy, tok.pad_token_id, AlgoConfig(kl_coef=coef, kl_penalty=kl_penalty), TrainConfig(autocast="none", micro_batch=3))
    _nudge(policy)
    groups = _groups(tok)
    exp = trainer.make_experience(groups)
    seqs = [(s, t.reward) for g in groups for t in g if t.info.get("ended") != "infra_error" for s in t.sequences()]
    assert len(exp.pairs) == len(seqs) == 13
    for b, (s, outcome) in enumerate(seqs):
        pair = [(s.prompt_ids, s.completion_ids)]
        old = completion_logprobs(policy, pair, tok.pad_token_id)[0][0].tolist()
        ref = completion_logprobs(trainer.ref, pair, tok.pad_token_id)[0][0].tolist()
        last = max(t for t, m in enumerate(s.loss_mask) if m)
        for t, m in enumerate(s.loss_mask):
            want = 0.0
            if m and kl_penalty == "reward":
                want -= coef * (old[t] - ref[t])
            if t == last:
                want += outcome
            got = exp.token_rewards[b, t].item()
            assert abs(got - want) < 1e-5, (b, t, got, want)
            if not m:  # environment tokens: no advantage, no return
                assert exp.advantages[b, t] == 0 and exp.returns[b, t] == 0
    if kl_penalty == "reward":
        assert exp.token_rewards[exp.mask > 0].ne(0).sum() > len(seqs)  # the penalty is really there


def _train_once(base, tok, groups, mb, **algo):
    model = copy.deepcopy(base)
    cfg = AlgoConfig(**{"kl_coef": 0.05, "ppo_epochs": 2, "mini_batches": 2, "critic_lr": 1e-3, **algo})
    trainer = PPOTrainer(model, tok.pad_token_id, cfg, TrainConfig(micro_batch=mb, autocast="none", lr=1e-3))
    # SGD at lr 1 (as test_distill's _plain_sgd): each step moves a parameter by its clipped
    # gradient (up to 0.23 here), so the two runs differ by the gradients' rounding (up to
    # 5e-7 on torch's AVX-512, AVX2 and scalar kernels). Adam's steps are ~lr * sign(g), flipped
    # by rounding where |g| ~ its eps: with Adam the four steps differed by up to 8.9e-6 here
    # (1.05e-5 on the scalar kernels) against the 1e-5 below, depending on the host's GEMM
    for opt, sched, params in (("optimizer", "scheduler", model), ("critic_optimizer", "critic_scheduler", trainer.critic)):
        setattr(trainer, opt, torch.optim.SGD(params.parameters(), lr=1.0))
        setattr(trainer, sched, torch.optim.lr_scheduler.LambdaLR(getattr(trainer, opt), lambda _: 1.0))
    m = trainer.step(groups)
    return m, {n: p.detach().clone() for n, p in model.named_parameters()}, {n: p.detach().clone() for n, p in trainer.critic.named_parameters()}


@pytest.mark.parametrize("algo", [{"aggregation": "token-mean"}, {"aggregation": "seq-mean-token-mean", "kl_penalty": "reward"}])
def test_micro_batch_1_and_8_give_the_same_actor_and_critic(algo):
    base, tok = load_policy("tiny-llama")
    groups = _groups(tok)
    m1, actor1, critic1 = _train_once(base, tok, groups, 1, **algo)
    _, actor8, critic8 = _train_once(base, tok, groups, 8, **algo)
    assert m1["grad_norm"] > 0 and m1["critic/grad_norm"] > 0
    for a, b in ((actor1, actor8), (critic1, critic8)):
        for n in a:
            diff = (a[n] - b[n]).abs().max().item()
            assert diff < 1e-5, f"{n}: max diff {diff}"
    initial = ValueModel(base)
    moved = [n for n, p in initial.named_parameters() if not torch.equal(p, critic1[n])]
    assert "head.weight" in moved and any(n.startswith("backbone.") for n in moved)  # the second mini-batch reaches the backbone


def _trainer(model, tok):
    algo = AlgoConfig(kl_coef=0.05, kl_target=0.01, ppo_epochs=2, mini_batches=2, critic_lr=1e-3)
    return PPOTrainer(model, tok.pad_token_id, algo, TrainConfig(autocast="none", lr=1e-3, micro_batch=4, warmup_steps=3))


def _params(model, trainer):
    return {**{f"actor.{n}": p.detach().clone() for n, p in model.named_parameters()},
            **{f"critic.{n}": p.detach().clone() for n, p in trainer.critic.named_parameters()}}


def test_state_dict_round_trip_two_plus_two_equals_four_bit_for_bit():
    _, tok = load_policy("tiny-llama")
    batches = [_groups(tok, seed=s) for s in range(4)]
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith("timing")}

    torch.manual_seed(0)
    model_a, _ = load_policy("tiny-llama")
    straight = _trainer(model_a, tok)
    metrics_a = [strip(straight.step(b)) for b in batches]

    torch.manual_seed(0)
    model_b, _ = load_policy("tiny-llama")
    first = _trainer(model_b, tok)
    metrics_b = [strip(first.step(b)) for b in batches[:2]]
    buf = io.BytesIO()
    torch.save({"weights": model_b.state_dict(), "trainer": first.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)

    model_c, _ = load_policy("tiny-llama")  # as a resumed run: the trainer is built on the initial weights
    resumed = _trainer(model_c, tok)
    model_c.load_state_dict(saved["weights"])
    resumed.load_state_dict(saved["trainer"])
    metrics_b += [strip(resumed.step(b)) for b in batches[2:]]

    a, c = _params(model_a, straight), _params(model_c, resumed)
    assert a.keys() == c.keys()
    for n in a:
        assert torch.equal(a[n], c[n]), f"{n}: max diff {(a[n] - c[n]).abs().max().item()}"
    assert straight.kl_coef == resumed.kl_coef != 0.05  # the adaptive coefficient moved and was restored
    assert metrics_a == metrics_b


def test_kl_coef_zero_builds_no_reference_and_infra_errors_are_dropped():
    model, tok = load_policy("tiny-llama")
    trainer = PPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.0), TrainConfig(autocast="none"))
    assert trainer.ref is None
    groups = _groups(tok)
    m = trainer.step(groups)
    assert m["kl"] == 0.0 and m["num_trained_seqs"] == 13  # 12 single-turn + 1 multi-turn; the infra error is out
    kept = [t.reward for g in groups for t in g if t.info.get("ended") != "infra_error"]
    assert m["reward"] == pytest.approx(sum(kept) / len(kept))
    with_ref = PPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.1), TrainConfig(autocast="none"))
    assert with_ref.ref is not None and not any(p.requires_grad for p in with_ref.ref.parameters())
    broken = [[Trajectory(t.turns, t.reward, t.group, {"ended": "infra_error"}) for t in g] for g in groups]
    m = trainer.step(broken)
    assert m["num_trained_seqs"] == 0 and m["grad_norm"] == 0 and trainer.steps == 2


@pytest.mark.parametrize("overrides", [{"loss": "dual_clip"}, {"loss": "gspo", "aggregation": "seq-mean-token-mean"},
                                       {"entropy_coef": 0.01, "tis_cap": 2.0}, {"kl_penalty": "reward", "whiten_advantages": False},
                                       {"kl_estimator": "k1", "gamma": 0.9, "lam": 0.8}])
def test_variants_train_both_models_and_report_every_metric(overrides):
    model, tok = load_policy("tiny-llama")
    trainer = PPOTrainer(model, tok.pad_token_id, AlgoConfig(**{"kl_coef": 0.05, **overrides}), TrainConfig(autocast="none", lr=1e-3))
    before = _params(model, trainer)
    m = trainer.step(_groups(tok))
    missing = [k for k in METRICS if k not in m]
    assert not missing, missing
    assert all(torch.isfinite(torch.tensor(float(m[k]))) for k in METRICS if k != "critic/explained_variance")
    after = _params(model, trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before if n.startswith("actor."))
    assert any(not torch.equal(before[n], after[n]) for n in before if n.startswith("critic."))


# --- learning check: reward = fraction of sampled tokens that are vowels ("aeiou"), sampled
# from the model itself by the rollout sampler; a random tiny model emits them ~2% of the time.

def _vowel_groups(model, tok, step: int, prompts, group_size=8, max_new_tokens=8):
    from longhaul.inference import RolloutParams, generate

    vowels = set(tok("aeiou", add_special_tokens=False).input_ids)
    flat = [p for p in prompts for _ in range(group_size)]
    outs = generate(model, tok, flat, RolloutParams(max_new_tokens=max_new_tokens, temperature=1.0), seed=step)
    groups = [[] for _ in prompts]
    for i, o in enumerate(outs):
        n = len(o.token_ids)
        turn = Turn(flat[i], o.token_ids, o.logprobs, [step] * n, [1] * n, o.finish_reason)
        groups[i // group_size].append(Trajectory([turn], sum(t in vowels for t in o.token_ids) / n, i // group_size))
    return groups


def _learn(make_trainer, steps=50):
    torch.manual_seed(0)
    model, tok = load_policy("tiny-llama")
    trainer = make_trainer(model, tok)
    prompts = [tok(f"Say {w}", add_special_tokens=False).input_ids for w in ("kalo", "mine", "ruti", "vopa")]
    rewards = [trainer.step(_vowel_groups(model, tok, step, prompts))["reward"] for step in range(steps)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"reward first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    return first, last


def test_ppo_raises_the_reward_of_a_sampled_task_within_50_steps():
    def make(model, tok):
        algo = AlgoConfig(kl_coef=0.0, critic_lr=1e-3)
        return PPOTrainer(model, tok.pad_token_id, algo, TrainConfig(lr=2e-3, autocast="none", micro_batch=32), max_new_tokens=8)
    first, last = _learn(make)
    assert last > first + 0.2, (first, last)


def test_grpo_raises_the_reward_of_the_same_task_within_50_steps():
    from longhaul.rl.grpo import GRPOTrainer

    def make(model, tok):
        return GRPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.0), TrainConfig(lr=2e-3, autocast="none", micro_batch=32),
                           max_new_tokens=8)
    first, last = _learn(make)
    assert last > first + 0.2, (first, last)
