import copy
import math
import random

import pytest
import torch
from transformers import Qwen2Config

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.errors import LonghaulError
from longhaul.models import load_policy
from longhaul.models.loader import _tiny
from longhaul.rl.data import encode_sft_row
from longhaul.rl.distill import DISTILL_LOSSES, DistillTrainer, OnPolicyDistillTrainer, check_vocab
from longhaul.rl.logprobs import completion_logprobs
from longhaul.types import Trajectory, Turn

NAMES = ["forward_kl", "reverse_kl", "jsd"]



# ---- the divergences against plain loops ---------------------------------------------------------

def _softmax(row, tau):
    z = [x / tau for x in row]
    top = max(z)
    e = [math.exp(x - top) for x in z]
    total = sum(e)
    return [x / total for x in e]


def _kl_ref(p, q):
    return sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q))


def _reference(name, s_logits, t_logits, tau, beta):
    """Per-token divergence (B, T) by loops over tokens and vocabulary, in Python floats."""
    B, T, _ = s_logits.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for i in range(T):
            p_s, p_t = _softmax(s_logits[b, i].tolist(), tau), _softmax(t_logits[b, i].tolist(), tau)
            if name == "forward_kl":
                out[b, i] = _kl_ref(p_t, p_s)
            elif name == "reverse_kl":
                out[b, i] = _kl_ref(p_s, p_t)
            else:
                m = [beta * a + (1 - beta) * c for a, c in zip(p_t, p_s)]
                out[b, i] = beta * _kl_ref(p_t, m) + (1 - beta) * _kl_ref(p_s, m)
    return out


def _logits(seed, shape=(2, 3, 11), scale=3.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("tau", [1.0, 0.5, 2.0])
def test_divergence_matches_loop_reference(name, tau):
    s, t = _logits(0), _logits(1)
    got = DISTILL_LOSSES[name](s, t, temperature=tau, beta=0.3)
    want = _reference(name, s, t, tau, 0.3)
    assert got.shape == (2, 3)
    err = ((got - want).abs() / want.abs()).max().item()
    assert err < 1e-5, f"{name} tau={tau}: max relative diff {err}"
    # fp32 inputs (what the trainers pass) agree to fp32 precision: relative, as the divergences
    # run 0.05-16 (at 16 an absolute 1e-5 is ~10 ulps); measured within 3e-7 relative on
    # torch's AVX-512, AVX2 and scalar kernels, so rtol 1e-5 (~80 fp32 eps) holds with margin
    got32 = DISTILL_LOSSES[name](s.float(), t.float(), temperature=tau, beta=0.3)
    torch.testing.assert_close(got32.double(), want, rtol=1e-5, atol=1e-7, msg=lambda m: f"{name} tau={tau} fp32\n{m}")


@pytest.mark.parametrize("name", NAMES)
def test_divergence_zero_on_equal_nonnegative_and_tempers_both(name):
    s = _logits(2, (4, 5, 23))
    zero = DISTILL_LOSSES[name](s, s.clone(), temperature=1.7)
    assert zero.abs().max().item() < 1e-12
    for seed in range(5):
        s, t = _logits(10 + seed, (4, 5, 23), scale=5.0), _logits(20 + seed, (4, 5, 23), scale=5.0)
        assert DISTILL_LOSSES[name](s, t, temperature=0.7).min().item() >= 0
    a = DISTILL_LOSSES[name](s, t, temperature=2.5)
    b = DISTILL_LOSSES[name](s / 2.5, t / 2.5, temperature=1.0)
    assert (a - b).abs().max().item() < 1e-12
    # large logits stay finite (log-space throughout)
    huge = DISTILL_LOSSES[name](s * 1e4, t * 1e4)
    assert torch.isfinite(huge).all()


def test_jsd_limits_symmetry_and_bound():
    # moderate logits: the limits are approached once beta * p_t / p_s << 1 on every token
    s, t = _logits(3, (3, 4, 17), scale=1.0), _logits(4, (3, 4, 17), scale=1.0)
    fwd, rev, jsd = DISTILL_LOSSES["forward_kl"](s, t), DISTILL_LOSSES["reverse_kl"](s, t), DISTILL_LOSSES["jsd"]
    eps = 1e-6
    # GKD: JSD(beta) behaves as beta * KL(teacher || student) near 0, (1 - beta) * KL(student || teacher) near 1
    near0 = jsd(s, t, beta=eps) / eps
    near1 = jsd(s, t, beta=1 - eps) / eps
    for got, want in ((near0, fwd), (near1, rev)):
        err = ((got - want).abs() / want).max().item()
        assert err < 1e-3, f"limit relative diff {err}"
    # swapping teacher and student mirrors beta
    assert (jsd(s, t, beta=0.2) - jsd(t, s, beta=0.8)).abs().max().item() < 1e-12
    # bounded by the binary entropy of beta (reached for disjoint supports)
    beta = 0.3
    h = -beta * math.log(beta) - (1 - beta) * math.log(1 - beta)
    assert jsd(s, t, beta=beta).max().item() <= h
    a = torch.tensor([[[100.0, -100.0]]], dtype=torch.float64)
    assert abs(jsd(a, -a, beta=beta).item() - h) < 1e-9


# ---- models and data ------------------------------------------------------------------------------

def _teacher(scale: float = 5.0):
    """A different tiny model (Qwen2 layout, seed 1, same byte tokenizer), made confident by
    scaling its final norm so the distillation target is far from the near-uniform student."""
    model, _ = _tiny(Qwen2Config, seed=1, rope_theta=10000.0)
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)
    return model


def _rows(tok, start: int, n: int, seed: int = 0):
    rng = random.Random(seed)
    rows = []
    for i in range(start, start + n):
        text = "".join(rng.choice("abcdefghij ") for _ in range(rng.randint(8, 20)))
        rows.append(encode_sft_row(tok, {"prompt": [{"role": "user", "content": f"item {i}"}], "completion": text}))
    return rows


def _cfg(**kw):
    return TrainConfig(**{"autocast": "none", "lr": 3e-3, "micro_batch": 8, **kw})


def _plain_sgd(trainer, model):
    """Swap in SGD at lr 1 with no clipping, so one step moves each parameter by exactly its
    gradient. Adam's first step is ~lr * sign(g): blind to a mis-scaled gradient, and flipped by
    rounding wherever |g| ~ eps, so it would make a poor accumulation check."""
    trainer.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda _: 1.0)
    return trainer


def _full_reference(student, teacher, batch, name, tau, pad_id):
    """Mean divergence over loss tokens from the full (B, L, V) logits of both models."""
    from longhaul.rl.logprobs import right_pad

    ids, attn = right_pad([x for x, _ in batch], pad_id)
    mask = torch.zeros(ids.shape)
    for b, (_, m) in enumerate(batch):
        mask[b, : len(m)] = torch.tensor(m, dtype=torch.float32)
    with torch.no_grad():
        s = student(input_ids=ids, attention_mask=attn).logits[:, :-1]
        t = teacher(input_ids=ids, attention_mask=attn).logits[:, :-1]
    div = DISTILL_LOSSES[name](s, t, temperature=tau, beta=0.5)
    return ((div * mask[:, 1:]).sum() / mask[:, 1:].sum()).item()


@pytest.mark.parametrize("name", NAMES)
def test_head_at_loss_positions_matches_full_logits(name):
    student, tok = load_policy("tiny-llama")
    teacher = _teacher()
    batch = _rows(tok, 0, 5)
    trainer = DistillTrainer(student, teacher, tok.pad_token_id, AlgoConfig(distill_loss=name, distill_temperature=1.5), _cfg(micro_batch=2))
    got = trainer.evaluate(batch)["heldout/divergence"]
    want = _full_reference(student, teacher, batch, name, 1.5, tok.pad_token_id)
    assert abs(got - want) < 1e-5 * max(1.0, want), (got, want)


@pytest.mark.parametrize("name", NAMES)
def test_offline_accumulation_equals_full_batch(name):
    base, tok = load_policy("tiny-llama")
    teacher, batch = _teacher(), _rows(tok, 0, 6)
    params = []
    for mb in (1, 8):
        model = copy.deepcopy(base)
        trainer = DistillTrainer(model, teacher, tok.pad_token_id, AlgoConfig(distill_loss=name), _cfg(micro_batch=mb, grad_clip=1e9))
        m = _plain_sgd(trainer, model).step(batch)
        assert m["grad_norm"] > 0 and m["num_tokens"] == sum(sum(x[1:]) for _, x in batch)
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for n in params[0]:
        diff = (params[0][n] - params[1][n]).abs().max().item()
        assert diff < 1e-5, f"{n}: max diff {diff}"


def test_offline_distillation_lowers_heldout_divergence():
    student, tok = load_policy("tiny-llama")
    teacher = _teacher()
    train, heldout = _rows(tok, 0, 8, seed=0), _rows(tok, 100, 8, seed=1)
    trainer = DistillTrainer(student, teacher, tok.pad_token_id, AlgoConfig(distill_loss="forward_kl"), _cfg())
    before = trainer.evaluate(heldout)
    for _ in range(20):
        m = trainer.step(train)
    after = trainer.evaluate(heldout)
    print("offline forward_kl held-out", before, after, m)
    assert after["heldout/divergence"] < 0.3 * before["heldout/divergence"], (before, after)
    assert after["heldout/ce"] < before["heldout/ce"]  # towards the teacher's (confident) predictions
    assert set(m) >= {"loss", "grad_norm", "num_tokens", "distill/forward_kl", "ce", "lr"}


def test_vocabulary_mismatch_is_refused_unless_the_extra_rows_are_padding():
    student, tok = load_policy("tiny-llama")
    V = len(tok)
    assert check_vocab(V, V) == V
    assert check_vocab(V, V + 61, vocab_size=V) == V
    wide = copy.deepcopy(student)
    wide.resize_token_embeddings(V + 61)  # padded rows past the tokenizer
    for cls in (DistillTrainer, OnPolicyDistillTrainer):
        with pytest.raises(LonghaulError, match=rf"teacher vocabulary \({V + 61} logits\).*student's \({V} logits.*same tokenizer family"):
            cls(student, wide, tok.pad_token_id, AlgoConfig(), _cfg())
    with pytest.raises(LonghaulError, match="tokenizer 300"):
        check_vocab(V, V + 61, vocab_size=300)  # rows 259..299 would be real tokens the student cannot emit
    trainer = DistillTrainer(student, wide, tok.pad_token_id, AlgoConfig(), _cfg(), vocab_size=V)
    m = trainer.step(_rows(tok, 0, 2))
    assert math.isfinite(m["loss"]) and trainer.width == V


def test_offline_state_dict_round_trip_is_bit_identical():
    base, tok = load_policy("tiny-llama")
    teacher, batches = _teacher(), [_rows(tok, 10 * k, 3, seed=k) for k in range(4)]
    cfg, algo = _cfg(warmup_steps=3), AlgoConfig(distill_loss="jsd")
    a = copy.deepcopy(base)
    ta = DistillTrainer(a, teacher, tok.pad_token_id, algo, cfg)
    ma = [ta.step(b) for b in batches]
    b = copy.deepcopy(base)
    tb = DistillTrainer(b, teacher, tok.pad_token_id, algo, cfg)
    mb = [tb.step(x) for x in batches[:2]]
    weights, state = copy.deepcopy(b.state_dict()), copy.deepcopy(tb.state_dict())
    c = copy.deepcopy(base)
    c.load_state_dict(weights)
    tc = DistillTrainer(c, teacher, tok.pad_token_id, algo, cfg)
    tc.load_state_dict(state)
    mb += [tc.step(x) for x in batches[2:]]
    assert [m["lr"] for m in ma] == [m["lr"] for m in mb]
    assert ma == mb
    for k, v in a.state_dict().items():
        assert torch.equal(v, c.state_dict()[k]), k


# ---- on-policy ------------------------------------------------------------------------------------

def _groups(student, tok, n_groups=3, size=4, seed=0, env_tokens=False):
    """Synthetic groups; behaviour log-probs are the student's own (as a sampler would report)."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for k in range(n_groups):
        prompt = tok(f"<|im_start|>user\nprompt number {k}<|im_end|>\n").input_ids
        group = []
        for j in range(size):
            n = int(torch.randint(2, 9, (1,), generator=g))
            ids = torch.randint(3, 200, (n,), generator=g).tolist()
            with torch.no_grad():
                lp = completion_logprobs(student, [(prompt, ids)], tok.pad_token_id)[0][0].tolist()
            turns = [Turn(prompt, ids, lp, [0] * n, [1] * n)]
            if env_tokens:  # an observation, then a second reply in the same segment
                obs = tok("<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n").input_ids
                more = torch.randint(3, 200, (3,), generator=g).tolist()
                p2 = prompt + ids + obs
                with torch.no_grad():
                    lp2 = completion_logprobs(student, [(p2, more)], tok.pad_token_id)[0][0].tolist()
                turns.append(Turn(p2, more, lp2, [0] * 3, [1] * 3))
            group.append(Trajectory(turns, float(torch.rand((), generator=g)), k))
        groups.append(group)
    return groups


@pytest.mark.parametrize("share_prompt", [True, False])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_onpolicy_accumulation_equals_full_batch(share_prompt, aggregation):
    base, tok = load_policy("tiny-llama")
    teacher, groups = _teacher(), _groups(base, tok)
    params = []
    for mb in (1, 16):
        model = copy.deepcopy(base)
        cfg = _cfg(micro_batch=mb, share_prompt=share_prompt, grad_clip=1e9)
        m = _plain_sgd(OnPolicyDistillTrainer(model, teacher, tok.pad_token_id, AlgoConfig(aggregation=aggregation), cfg), model).step(groups)
        assert m["num_trained_seqs"] == 12 and m["grad_norm"] > 0
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for n in params[0]:
        diff = (params[0][n] - params[1][n]).abs().max().item()
        assert diff < 1e-5, f"{n}: max diff {diff}"


def test_onpolicy_scores_model_tokens_only_and_drops_infra_errors():
    student, tok = load_policy("tiny-llama")
    teacher = _teacher()
    groups = _groups(student, tok, n_groups=2, size=3, env_tokens=True)
    bad = groups[0][1]
    bad.info["ended"] = "infra_error"
    bad.reward = 123.0
    seqs = [s for g in groups for t in g if t is not bad for s in t.sequences()]
    assert any(0 in s.loss_mask for s in seqs)
    pairs = [(s.prompt_ids, s.completion_ids) for s in seqs]
    with torch.no_grad():
        t_lp, mask, _ = completion_logprobs(teacher, pairs, tok.pad_token_id)
    n_tok = sum(sum(s.loss_mask) for s in seqs)
    want = sum(sum(m * (b - t) for m, b, t in zip(s.loss_mask, s.logprobs, t_lp[i].tolist())) for i, s in enumerate(seqs)) / n_tok
    trainer = OnPolicyDistillTrainer(student, teacher, tok.pad_token_id, AlgoConfig(), _cfg())
    m = trainer.step(groups)
    assert m["num_tokens"] == n_tok and m["num_trained_seqs"] == len(seqs)
    assert abs(m["distill/reverse_kl"] - want) < 1e-5, (m["distill/reverse_kl"], want)
    assert abs(m["loss"] - want) < 1e-5  # ratio 1, token-mean: the loss is the mean of -A
    assert m["reward"] < 2  # the infra error's reward was replaced, not averaged in
    assert set(m) >= {"reward", "distill/reverse_kl", "loss", "grad_norm", "num_tokens", "entropy"}


def test_onpolicy_with_itself_as_teacher_and_reward_weight_is_grpo():
    """Teacher == student: the distillation advantage vanishes and reward_weight=1 leaves
    exactly GRPO's outcome advantage (no reference KL, equal-reward groups kept)."""
    from longhaul.rl.grpo import GRPOTrainer

    base, tok = load_policy("tiny-llama")
    groups = _groups(base, tok)
    for t in groups[1]:
        t.reward = 0.5  # an equal-reward group: no outcome signal, still trained on
    cfg, algo = _cfg(grad_clip=1e9), AlgoConfig(kl_coef=0.0, drop_zero_std_groups=False)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    m = _plain_sgd(OnPolicyDistillTrainer(a, copy.deepcopy(base), tok.pad_token_id, AlgoConfig(), cfg, reward_weight=1.0), a).step(groups)
    _plain_sgd(GRPOTrainer(b, tok.pad_token_id, algo, cfg), b).step(groups)
    assert abs(m["distill/reverse_kl"]) < 1e-5 and m["num_trained_seqs"] == 12
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        diff = (p - q).abs().max().item()
        assert diff < 1e-5, f"{n}: max diff {diff}"


def test_onpolicy_state_dict_round_trip_is_bit_identical():
    base, tok = load_policy("tiny-llama")
    teacher = _teacher()
    batches = [_groups(base, tok, n_groups=2, size=2, seed=k) for k in range(4)]
    cfg, algo = _cfg(warmup_steps=3), AlgoConfig()
    a = copy.deepcopy(base)
    ta = OnPolicyDistillTrainer(a, teacher, tok.pad_token_id, algo, cfg)
    ma = [ta.step(g) for g in batches]
    b = copy.deepcopy(base)
    tb = OnPolicyDistillTrainer(b, teacher, tok.pad_token_id, algo, cfg)
    for g in batches[:2]:
        tb.step(g)
    weights, state = copy.deepcopy(b.state_dict()), copy.deepcopy(tb.state_dict())
    c = copy.deepcopy(base)
    c.load_state_dict(weights)
    tc = OnPolicyDistillTrainer(c, teacher, tok.pad_token_id, algo, cfg)
    tc.load_state_dict(state)
    mc = [tc.step(g) for g in batches[2:]]
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith("timing")}
    assert [strip(m) for m in ma[2:]] == [strip(m) for m in mc]
    for k, v in a.state_dict().items():
        assert torch.equal(v, c.state_dict()[k]), k


def _sample(model, tok, family, tasks, group_size, seed):
    from longhaul.agent.rollout import rollout_groups
    from longhaul.inference import RolloutParams

    params = RolloutParams(max_new_tokens=16, temperature=1.0, stop=family.stop)
    return rollout_groups(model, tok, family, tasks, group_size, params, seed=seed)[0]


def test_onpolicy_distillation_lowers_reverse_kl_of_own_samples():
    from longhaul.envs import get_family

    student, tok = load_policy("tiny-llama")
    with torch.no_grad():  # a confident student: a uniform one's samples tell the teacher little per token
        student.model.norm.weight.mul_(5.0)
    teacher = _teacher()
    family = get_family("echo")
    tasks, heldout = family.make_split("train", 200, 1), family.make_split("heldout", 8, 1)
    trainer = OnPolicyDistillTrainer(student, teacher, tok.pad_token_id, AlgoConfig(), _cfg(lr=1e-3, micro_batch=16), max_new_tokens=16)
    # exact reverse KL (full vocabulary) per model token, on the student's own held-out samples
    judge = DistillTrainer(student, teacher, tok.pad_token_id, AlgoConfig(distill_loss="reverse_kl"), _cfg(micro_batch=64))

    def heldout_rkl():
        seqs = [s for g in _sample(student, tok, family, heldout, 4, seed=999) for t in g for s in t.sequences()]
        return judge.evaluate([(s.prompt_ids + s.completion_ids, [0] * len(s.prompt_ids) + s.loss_mask) for s in seqs])["heldout/divergence"]

    before, curve = heldout_rkl(), []
    for step in range(40):
        curve.append(trainer.step(_sample(student, tok, family, tasks[4 * step: 4 * step + 4], 4, seed=step))["distill/reverse_kl"])
    after = heldout_rkl()
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    print(f"on-policy reverse KL: held-out {before:.3f} -> {after:.3f}; training samples {first:.3f} -> {last:.3f}")
    assert after < 0.7 * before and last < first, (before, after, first, last)
