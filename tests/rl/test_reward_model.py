import torch

from longhaul.config import AlgoConfig, TrainConfig

from longhaul.models import load_policy
from longhaul.rl.reward_model import RewardModel, RewardTrainer, as_reward_function, bradley_terry_loss


def test_bradley_terry_matches_formula():
    rc, rr = torch.tensor([1.0, -0.5]), torch.tensor([0.0, 0.5])
    want = torch.tensor([torch.log1p(torch.exp(torch.tensor(-1.0))), torch.log1p(torch.exp(torch.tensor(1.0)))])
    assert torch.allclose(bradley_terry_loss(rc, rr), want, atol=1e-6)


def test_reward_model_ranks_held_out_pairs_above_chance():
    lm, tok = load_policy("tiny-llama")
    rm = RewardModel(lm, tok.pad_token_id)
    good = ["great", "lovely", "superb", "nice", "fine", "grand", "super", "sweet", "neat", "brave"]
    bad = ["awful", "nasty", "dreadful", "vile", "rotten", "poor", "grim", "foul", "dire", "crude"]
    enc = lambda w: tok(f"the answer is {w}", add_special_tokens=False).input_ids
    pairs = [(enc(g), enc(b)) for g, b in zip(good, bad)]
    train, held = pairs[:7], pairs[7:] + [(enc(g), enc(b)) for g, b in zip(good[7:], bad[:3])]
    trainer = RewardTrainer(rm, AlgoConfig(name="rm"), TrainConfig(lr=3e-3, micro_batch=8, autocast="none"))
    for _ in range(40):
        trainer.step(train)
    assert trainer.accuracy(train) == 1.0
    assert trainer.accuracy(held) > 0.5
    fn = as_reward_function(rm, tok)
    scores = fn(["great", "awful"], prompts=["the answer is ", "the answer is "])
    assert len(scores) == 2 and scores[0] > scores[1]
