"""bf16 autocast that follows the weights to whichever device holds them.

`train.autocast: bfloat16` means the training forwards compute in bf16 over fp32 master weights.
torch keeps one autocast state per device type, so `autocast("bfloat16")` enters it for the CPU
and, where torch sees CUDA, for the GPU too; code that asks whether autocast is on asks for the
device its tensors live on (`autocast_dtype(t.device)`).
"""

from __future__ import annotations

import contextlib

import torch


def _device_types() -> tuple[str, ...]:
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def autocast(dtype: str):
    """A context running matmuls in bf16 on every device when `dtype` is 'bfloat16'; else a no-op."""
    if dtype != "bfloat16":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for d in _device_types():
        stack.enter_context(torch.autocast(d, dtype=torch.bfloat16))
    return stack


def autocast_dtype(device: torch.device | str = "cpu") -> torch.dtype | None:
    """The dtype autocast runs matmuls in on `device` now, or None when it is off there."""
    kind = torch.device(device).type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def no_autocast(device: torch.device | str = "cpu"):
    """A context with autocast off on `device` (for code whose inputs are already cast)."""
    return torch.autocast(torch.device(device).type, enabled=False)
