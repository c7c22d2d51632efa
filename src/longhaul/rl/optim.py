"""The optimizer and learning-rate schedule every trainer uses, and the one gradient step.

AdamW on fp32 master weights over the trainable parameters only (LoRA adapters when LoRA is
on), linear warm-up, then constant. `clip_and_step` clips the global gradient norm and refuses
to apply a non-finite gradient, so a NaN never reaches the weights or a checkpoint.
"""

from __future__ import annotations

import warnings

import torch

from longhaul.errors import LonghaulError


def make_optimizer(params, train, lr: float | None = None):
    """(optimizer, scheduler) for `params` from a TrainConfig; `lr` overrides train.lr (e.g. the critic's)."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise LonghaulError("the model has no trainable parameters; check train.lora_* or the model loader")
    kw = dict(lr=lr if lr is not None else train.lr, betas=(0.9, 0.99), eps=1e-8, weight_decay=train.weight_decay)
    try:  # the fused kernel is ~3.5x faster than the per-parameter loop on CPU (0.11 s vs 0.38 s for 135M params)
        opt = torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, ValueError):
        opt = torch.optim.AdamW(params, foreach=False, **kw)
    warm = train.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    return opt, sched


def clip_and_step(params, optimizer, scheduler, max_norm: float, loss_value: float = float("nan")) -> float:
    """Clip, check, step, zero. Returns the pre-clip gradient norm; raises on a non-finite one."""
    grad_norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise LonghaulError(f"training produced a non-finite gradient (loss {loss_value:.4g}); the weights were not "
                            f"updated and the last checkpoint is intact; lower train.lr or check the data/rewards, then --resume")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return grad_norm.item()


def advance_schedule(scheduler) -> None:
    """Advance the schedule by a training step, also one that updated nothing (no group had a
    reward signal): the schedule counts steps, not updates, so torch's warning that a scheduler
    stepped before its optimizer ever did is silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")
        scheduler.step()


class OptimizerState:
    """`state_dict` / `load_state_dict` of a trainer whose resumable state is `self.optimizer`
    and `self.scheduler` (trainers with more state extend both)."""

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
