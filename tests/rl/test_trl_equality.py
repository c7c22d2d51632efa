"""Our GRPO and DPO maths against TRL 1.16's own code, on the same model and tokens.

TRL is a test-only dependency (the `test` extra). Each check builds a real `trl` trainer on the
tiny model and calls the method that holds the maths (`GRPOTrainer._compute_loss`,
`GRPOTrainer._generate_and_score_completions`, `DPOTrainer._compute_loss`); ours is composed
from the registered functions the way our trainers compose them. Losses and every parameter's
gradient must agree within 1e-5.

Conventions where TRL's defaults differ from ours, and which setting the tests use:
- GRPO KL: TRL 1.16 multiplies the k3 term by the importance ratio (`use_bias_correction_kl=True`,
  DeepSeek-V3.2); we do not, so TRL runs with it off.
- Dr. GRPO divides by `max_completion_length`; `GRPOTrainer.step` passes the batch's longest
  completion as `max_len`. The test gives `aggregate` TRL's constant.
- TRL's `ipo` scores answers by per-token mean log-probs: that is our `ipo_norm`, not `ipo`.
"""

from __future__ import annotations

import copy

import pytest
import torch

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.models import load_policy
from longhaul.rl.advantages import ADVANTAGES
from longhaul.rl.dpo import DPO_LOSSES, MEAN_LOGPROB_LOSSES, DPOTrainer, sequence_logprobs
from longhaul.rl.logprobs import completion_logprobs
from longhaul.rl.losses import KL_ESTIMATORS, POLICY_LOSSES, aggregate

trl = pytest.importorskip("trl")
Dataset = pytest.importorskip("datasets").Dataset  # trl needs it; both come with the `test` extra

TOL = 1e-5
TEMPERATURE = 0.7  # not 1, so both sides' temperature scaling is compared too
MAX_COMPLETION = 12  # TRL's max_completion_length, longer than any completion below (Dr. GRPO's constant)


def _max_grad_diff(a, b) -> tuple[float, str]:
    """Largest |grad_a - grad_b| over same-named parameters, and the parameter it is in."""
    ga, gb = dict(a.named_parameters()), dict(b.named_parameters())
    worst, where = 0.0, ""
    for name, p in ga.items():
        d = (p.grad - gb[name].grad).abs().max().item()
        if d > worst:
            worst, where = d, name
    return worst, where


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model, saved so TRL can load its reference copy by path (beta != 0)."""
    model, tok = load_policy("tiny-llama")
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    model.config._name_or_path = str(path)
    return model, tok


def _trl_args(cls, tmp_path, **kw):
    return cls(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, save_strategy="no", **kw)


# ---------------------------------------------------------------- GRPO


def _grpo_batch(model, pad_id: int):
    """Six completions of equal-length prompts (TRL left-pads prompts; equal lengths keep the
    token positions identical to our right-padded layout), ragged completions, mixed-sign
    advantages, and old / reference log-probs pushed off the current ones."""
    g = torch.Generator().manual_seed(0)
    B, P = 6, 5
    lens = [3, 7, 1, 5, 7, 2]
    prompts = torch.randint(3, 259, (B, P), generator=g)
    T = max(lens)
    comp = torch.full((B, T), pad_id, dtype=torch.long)
    cmask = torch.zeros((B, T), dtype=torch.long)
    for b, n in enumerate(lens):
        comp[b, :n] = torch.randint(3, 259, (n,), generator=g)
        cmask[b, :n] = 1
    pairs = [(prompts[b].tolist(), comp[b, :n].tolist()) for b, n in enumerate(lens)]
    with torch.no_grad():
        cur, mask, _ = completion_logprobs(model, pairs, pad_id, TEMPERATURE)  # (B, T)
    # ratio = exp(cur - old) spans about [0.67, 1.5]: past both clip bounds, for both signs of A
    old = (cur + (torch.rand((B, T), generator=g) * 0.8 - 0.4)) * mask
    ref = (cur + 0.3 * torch.randn((B, T), generator=g)) * mask
    adv = torch.tensor([1.3, -0.7, 0.4, -1.1, 0.9, -0.2])
    inputs = {
        "prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts),
        "completion_ids": comp, "completion_mask": cmask,
        "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": cmask.sum(),
    }
    return pairs, inputs


# TRL loss_type <-> our aggregation over the same per-token loss
GRPO_PAIRS = [("grpo", "seq-mean-token-mean"), ("bnpo", "token-mean"), ("dapo", "token-mean"),
              ("dr_grpo", "seq-mean-token-sum")]


@pytest.mark.parametrize("epsilon_high", [None, 0.28], ids=["eps", "eps_high"])
@pytest.mark.parametrize("loss_type,aggregation", GRPO_PAIRS, ids=[t for t, _ in GRPO_PAIRS])
def test_grpo_loss_and_grads_equal_trl(tiny, tmp_path, loss_type, aggregation, epsilon_high):
    base, tok = tiny
    ours_model, trl_model = copy.deepcopy(base), copy.deepcopy(base)  # TRL patches its model's forward
    pairs, inputs = _grpo_batch(base, tok.pad_token_id)
    eps, beta = 0.2, 0.04
    args = _trl_args(trl.GRPOConfig, tmp_path, per_device_train_batch_size=6, num_generations=3,
                     max_completion_length=MAX_COMPLETION, temperature=TEMPERATURE, beta=beta, epsilon=eps,
                     epsilon_high=epsilon_high, loss_type=loss_type, use_bias_correction_kl=False)
    trainer = trl.GRPOTrainer(model=trl_model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                              args=args, train_dataset=Dataset.from_dict({"prompt": ["x"] * 6}), processing_class=tok)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one micro-batch here
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()

    # ours, as GRPOTrainer.step composes it (one micro-batch: whole-batch normalisers)
    logp, mask, _ = completion_logprobs(ours_model, pairs, tok.pad_token_id, TEMPERATURE)
    clip_high = eps if epsilon_high is None else epsilon_high
    tok_loss, clipped = POLICY_LOSSES.get_fn("ppo_clip")(logp, inputs["old_per_token_logps"], inputs["advantages"],
                                                        clip_low=eps, clip_high=clip_high, mask=mask)
    tok_loss = tok_loss + beta * KL_ESTIMATORS.get_fn("k3")(logp, inputs["ref_per_token_logps"])
    loss = aggregate(tok_loss, mask, aggregation, mask.sum().item(), float(len(pairs)), MAX_COMPLETION)
    loss.backward()

    assert (clipped["low"] * mask).sum() > 0 and (clipped["high"] * mask).sum() > 0, "the batch must clip on both sides"
    d_loss = abs(loss.item() - trl_loss.item())
    assert d_loss < TOL, f"loss: ours {loss.item():.8f} vs TRL {trl_loss.item():.8f}, max diff {d_loss:.3e}"
    d_grad, where = _max_grad_diff(ours_model, trainer.model)
    assert d_grad < TOL, f"grad max diff {d_grad:.3e} in {where}"


# Rewards (G=3, N=4): distinct values, ties, and a zero-std group (both sides give it advantage 0)
REWARDS = torch.tensor([[0.3, 0.9, 0.1, 0.5], [1.0, 0.0, 0.0, 1.0], [0.7, 0.7, 0.7, 0.7]])


@pytest.mark.parametrize("scale_rewards,ours", [("group", "grpo"), ("none", "dr_grpo")])
def test_grpo_advantages_equal_trl(tiny, tmp_path, scale_rewards, ours):
    """TRL computes advantages inline in `_generate_and_score_completions`, so that whole method
    runs: it samples (short) completions, scores them with a reward function that hands back
    the fixed rewards from a dataset column, and normalises per group of `num_generations`."""
    base, tok = tiny
    G, N = REWARDS.shape
    args = _trl_args(trl.GRPOConfig, tmp_path, per_device_train_batch_size=G * N, num_generations=N,
                     max_completion_length=3, beta=0.0, scale_rewards=scale_rewards)

    def fixed_reward(completions, reward, **_):
        return list(reward)

    rows = [{"prompt": f"prompt {i}", "reward": REWARDS[i, j].item()} for i in range(G) for j in range(N)]
    trainer = trl.GRPOTrainer(model=copy.deepcopy(base), reward_funcs=fixed_reward, args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok)
    trl_adv = trainer._generate_and_score_completions(rows)["advantages"].view(G, N)
    adv = ADVANTAGES.get_fn(ours)(REWARDS)
    diff = (adv - trl_adv).abs().max().item()
    assert diff < TOL, f"advantages max diff {diff:.3e}\nours {adv}\nTRL {trl_adv}"


# ---------------------------------------------------------------- DPO


def _dpo_pairs():
    """Four (chosen, rejected) pairs of (ids, loss mask) with ragged prompts and answers."""
    g = torch.Generator().manual_seed(1)
    out = []
    for p_len, c_len, r_len in [(3, 4, 6), (6, 2, 2), (4, 7, 3), (5, 1, 5)]:
        prompt = torch.randint(3, 259, (p_len,), generator=g).tolist()
        side = []
        for n in (c_len, r_len):
            ids = prompt + torch.randint(3, 259, (n,), generator=g).tolist()
            side.append((ids, [0] * p_len + [1] * n))
        out.append(tuple(side))
    return out


def _trl_dpo_inputs(pairs, pad_id: int) -> dict:
    """TRL's batch layout: chosen rows then rejected rows, right-padded, completion mask aligned with ids."""
    seqs = [c for c, _ in pairs] + [r for _, r in pairs]
    L = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    attn, cmask = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, (x, m) in enumerate(seqs):
        ids[b, : len(x)], attn[b, : len(x)], cmask[b, : len(x)] = torch.tensor(x), 1, torch.tensor(m)
    return {"input_ids": ids, "attention_mask": attn, "completion_mask": cmask}


# TRL loss_type <-> our registered DPO loss
DPO_PAIRS = [("sigmoid", "sigmoid"), ("ipo", "ipo_norm")]


@pytest.mark.parametrize("trl_loss,ours", DPO_PAIRS, ids=[t for t, _ in DPO_PAIRS])
def test_dpo_loss_and_grads_equal_trl(tiny, tmp_path, trl_loss, ours):
    base, tok = tiny
    ref = copy.deepcopy(base)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        for p in ref.parameters():  # a reference that differs, so every log-ratio is non-zero
            p.add_(0.05 * torch.randn_like(p))
    pairs, beta, pad = _dpo_pairs(), 0.3, tok.pad_token_id
    ours_model, trl_model, trl_ref = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(ref)

    ds = Dataset.from_dict({"prompt": ["a"], "chosen": ["b"], "rejected": ["c"]})  # TRL requires one; unused
    args = _trl_args(trl.DPOConfig, tmp_path, per_device_train_batch_size=4, beta=beta, loss_type=[trl_loss])
    trainer = trl.DPOTrainer(model=trl_model, ref_model=trl_ref, args=args, train_dataset=ds, processing_class=tok)
    trl_loss_value = trainer._compute_loss(trainer.model, _trl_dpo_inputs(pairs, pad), return_outputs=False)
    trl_loss_value.backward()

    # ours, composed as DPOTrainer.step does (one micro-batch)
    mean = ours in MEAN_LOGPROB_LOSSES
    with torch.no_grad():
        ref_c = sequence_logprobs(ref, [c for c, _ in pairs], pad, mean=mean)
        ref_r = sequence_logprobs(ref, [r for _, r in pairs], pad, mean=mean)
    pi_c = sequence_logprobs(ours_model, [c for c, _ in pairs], pad, mean=mean)
    pi_r = sequence_logprobs(ours_model, [r for _, r in pairs], pad, mean=mean)
    loss = DPO_LOSSES.get_fn(ours)(pi_c, pi_r, ref_c, ref_r, beta).mean()
    loss.backward()

    # and through DPOTrainer itself, which must pick the same scores for this loss name. It takes
    # its reference from the model it is built on, so build it on `ref`, then load the policy.
    model = copy.deepcopy(ref)
    dpo = DPOTrainer(model, pad, AlgoConfig(name="dpo", beta=beta, dpo_loss=ours), TrainConfig(micro_batch=8, autocast="none"), pairs)
    model.load_state_dict(base.state_dict())
    step_loss = dpo.step(pairs)["loss"]

    d_loss = max(abs(loss.item() - trl_loss_value.item()), abs(step_loss - trl_loss_value.item()))
    assert d_loss < TOL, f"loss: ours {loss.item():.8f}, DPOTrainer {step_loss:.8f} vs TRL {trl_loss_value.item():.8f}; max diff {d_loss:.3e}"
    d_grad, where = _max_grad_diff(ours_model, trainer.model)
    assert d_grad < TOL, f"grad max diff {d_grad:.3e} in {where}"
