"""A Bradley-Terry reward model: a causal LM backbone with a scalar head read at the last
token, trained on preference pairs with -log sigmoid(r_chosen - r_rejected). A trained model
is usable as a reward function `(completions, prompts=...) -> list[float]` (the RLHF path)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from longhaul.errors import LonghaulError
from longhaul.malloc import within_step
from longhaul.models import load_policy
from longhaul.models.lora import is_adapter_dir, merged_from_checkpoint, unwrap
from longhaul.rl.data import encode_prompt_completion
from longhaul.ops.autocast import autocast as autocast_ctx  # a name apart from the `autocast` arguments
from longhaul.rl.logprobs import right_pad
from longhaul.rl.optim import OptimizerState, clip_and_step, make_optimizer
from longhaul.types import Score


class RewardModel(nn.Module):
    def __init__(self, lm, pad_id: int):
        super().__init__()

        self.backbone = unwrap(lm).base_model  # with LoRA, the backbone's layers carry the adapters
        self.head = nn.Linear(lm.config.hidden_size, 1, device=next(lm.parameters()).device)
        nn.init.zeros_(self.head.bias)
        nn.init.normal_(self.head.weight, std=1.0 / lm.config.hidden_size ** 0.5)
        self.pad_id = pad_id

    def forward(self, seqs: list[list[int]], autocast: str = "none") -> torch.Tensor:
        """Token-id sequences -> rewards (B,)."""
        ids, attn = (t.to(self.head.weight.device) for t in right_pad(seqs, self.pad_id))
        with autocast_ctx(autocast):
            hidden = self.backbone(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, L, H)
        last = hidden[torch.arange(len(seqs)), attn.sum(-1) - 1]  # (B, H)
        return self.head(last.float()).squeeze(-1)


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    return -F.logsigmoid(r_chosen - r_rejected)


class RewardTrainer(OptimizerState):
    """Bradley-Terry training on (chosen ids, rejected ids) pairs; the loss is the batch mean, so
    micro-batch accumulation gives the full-batch gradient."""

    def __init__(self, rm: RewardModel, algo, train):
        self.rm, self.train_cfg = rm, train
        self.optimizer, self.scheduler = make_optimizer(rm.parameters(), train)

    def step(self, pairs: list[tuple[list[int], list[int]]]) -> dict:
        self.rm.train()
        n, total, correct, margin = len(pairs), 0.0, 0, 0.0
        mb, ac = self.train_cfg.micro_batch, self.train_cfg.autocast
        for i in range(0, n, mb):
            chunk = pairs[i:i + mb]
            rc, rr = self.rm([c for c, _ in chunk], ac), self.rm([r for _, r in chunk], ac)
            loss = bradley_terry_loss(rc, rr).sum() / n
            loss.backward()
            within_step()  # bound the kept heap between micro-batches (`malloc.within_step`)
            total += loss.item()
            correct += int((rc > rr).sum())
            margin += (rc - rr).sum().item()
        lr = self.scheduler.get_last_lr()[0]
        grad_norm = clip_and_step(self.rm.parameters(), self.optimizer, self.scheduler, self.train_cfg.grad_clip, total)
        return {"loss": total, "accuracy": correct / n, "margin": margin / n, "grad_norm": grad_norm, "lr": lr}

    @torch.no_grad()
    def evaluate(self, pairs) -> dict:
        """Held-out ranking accuracy (chosen scored above rejected) and mean margin."""
        self.rm.eval()
        mb = self.train_cfg.micro_batch
        diffs = torch.cat([self.rm([c for c, _ in pairs[i:i + mb]]) - self.rm([r for _, r in pairs[i:i + mb]])
                           for i in range(0, len(pairs), mb)])
        return {"heldout/accuracy": (diffs > 0).float().mean().item(), "heldout/margin": diffs.mean().item()}

    def accuracy(self, pairs) -> float:
        return self.evaluate(pairs)["heldout/accuracy"]


HEAD_FILE = "reward_head.safetensors"


def save_head(rm: RewardModel, path: Path) -> None:
    """The scalar head beside the backbone's HF files (the backbone is saved as a causal LM)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in rm.head.state_dict().items()}, str(path / HEAD_FILE))


def load_head(rm: RewardModel, path: Path) -> None:
    from safetensors.torch import load_file

    rm.head.load_state_dict(load_file(str(Path(path) / HEAD_FILE)))


def load_reward_model(path: str | Path) -> tuple[RewardModel, object]:
    """(reward model, tokenizer) from a checkpoint or export directory of an `algo.name: rm` run."""
    path = Path(path)
    if not (path / HEAD_FILE).is_file():
        raise LonghaulError(f"{str(path)!r} has no {HEAD_FILE}; pass a checkpoint or export of an `algo.name: rm` run")
    if is_adapter_dir(path):
        lm, tok = merged_from_checkpoint(path)
    else:
        lm, tok = load_policy(str(path))
    rm = RewardModel(lm, tok.pad_token_id)
    load_head(rm, path)
    rm.eval()
    return rm, tok


def as_reward_function(rm: RewardModel, tok):
    """Wrap a reward model as a TRL-style reward function over plain-text completions."""
    @torch.no_grad()
    def reward(completions: list[str], prompts: list[str] | None = None, **_) -> list[float]:
        rm.eval()
        texts = [(p or "") + c for p, c in zip(prompts or [""] * len(completions), completions)]
        return rm([tok(t, add_special_tokens=False).input_ids or [tok.pad_token_id] for t in texts]).tolist()
    return reward


def reward_model_family(base, path: str | Path):
    """`base` (a single-turn task family) rewarded by a trained reward model: the reward of a reply
    is the model's score of (the task's chat prompt, the reply); pass/fail and the status still
    come from the family's own verifier, so pass rates stay comparable. The RLHF path."""
    from dataclasses import replace

    if base.kind != "answer":
        raise LonghaulError(f"a reward model scores single-turn replies; family {base.name!r} is multi-turn (its env verifies)")
    rm, tok = load_reward_model(path)

    @torch.no_grad()
    def score_many(tasks, replies, **kw):
        verdicts = base.score_many(tasks, replies, **kw)
        seqs = [encode_prompt_completion(tok, [{"role": "user", "content": t.prompt}], r)[0] for t, r in zip(tasks, replies)]
        rewards = torch.cat([rm(seqs[i:i + 16]) for i in range(0, len(seqs), 16)]).tolist()
        return [Score(float(r), v.passed, v.status) for r, v in zip(rewards, verdicts)]

    return replace(base, score_many=score_many)
