import copy
import math

import torch

from longhaul.config import AlgoConfig, TrainConfig

from longhaul.models import load_policy
from longhaul.rl.dpo import DPO_LOSSES, DPOTrainer, encode_pairs


def test_dpo_losses_match_formulas():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (torch.randn(6, generator=g, dtype=torch.float64) for _ in range(4))
    beta = 0.3
    s = DPO_LOSSES.get_fn("sigmoid")(pc, pr, rc, rr, beta)
    i = DPO_LOSSES.get_fn("ipo")(pc, pr, rc, rr, beta)
    for k in range(6):
        m = (pc[k] - rc[k] - (pr[k] - rr[k])).item()
        assert abs(s[k].item() - math.log(1 + math.exp(-beta * m))) < 1e-12
        assert abs(i[k].item() - (m - 1 / (2 * beta)) ** 2) < 1e-12


def test_dpo_reaches_high_preference_accuracy_on_its_pairs():
    model, tok = load_policy("tiny-qwen2")
    words = ["red", "blue", "green", "gold", "gray", "pink", "teal", "navy"]
    rows = [{"prompt": [{"role": "user", "content": f"pick {i}"}], "chosen": w, "rejected": words[(i + 3) % 8][::-1]}
            for i, w in enumerate(words)]
    pairs = encode_pairs(tok, rows)
    trainer = DPOTrainer(model, tok.pad_token_id, AlgoConfig(name="dpo", beta=0.1), TrainConfig(lr=2e-3, micro_batch=4, autocast="none"), pairs)
    assert trainer.accuracy(pairs) == 0.0  # the implicit reward starts at exactly 0 for every pair
    for _ in range(25):
        trainer.step(pairs)
    assert trainer.accuracy(pairs) > 0.9


def test_dpo_accumulation_is_exact_and_reference_is_the_starting_model():
    model, tok = load_policy("tiny-llama")
    rows = [{"prompt": f"q{i}", "chosen": "yes " * (i + 1), "rejected": "no"} for i in range(6)]
    pairs = encode_pairs(tok, rows)
    params = []
    for mb in (1, 6):
        m = copy.deepcopy(model)
        DPOTrainer(m, tok.pad_token_id, AlgoConfig(name="dpo"), TrainConfig(lr=1e-3, micro_batch=mb, autocast="none"), pairs).step(pairs)
        params.append(dict(m.named_parameters()))
    for n in params[0]:
        assert torch.allclose(params[0][n], params[1][n], atol=1e-5), f"{n}: {(params[0][n] - params[1][n]).abs().max()}"
