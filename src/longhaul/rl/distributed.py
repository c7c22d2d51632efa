"""Data-parallel training over torch.distributed (gloo on CPU, NCCL on GPU), through torch's
`DistributedDataParallel` (`ddp`, the default) or FSDP2's `fully_shard` (`fsdp2`).

Each rank holds a shard of the batch (whole groups, so group baselines stay exact). A trainer asks
for the batch-wide normalisers (`sum`, `max` over ranks), so every rank's loss is already its share
of the global mean; the gradient reduction therefore sums over ranks (DDP: a comm hook; FSDP2: a
divide factor of 1) instead of averaging. One optimizer step on the summed, clipped gradient is then
one process's step on the whole batch (to float rounding; tested within 1e-5).

A trainer's training forward goes through `forward(fn, ...)`, which runs `fn(policy, ...)` inside
the wrapped module's `__call__`, where DDP and FSDP2 hook in (the packed forward calls the layers
directly, never `policy(...)`). A micro-batch loop puts every backward but the last in
`accumulate()` (DDP's `no_sync`), so each rank syncs once a step; a rank without data still joins
that backward with `join()`, a zero-weighted loss on the trainable parameters.

DDP wraps the policy itself, so checkpoints and weight sync read it as before. FSDP2 shards a
copy (one unit: the trainer's forward does not call the layers' hooks) and `publish` copies the
gathered weights into the plain policy after every step, so rank 0 keeps the full weights the
rollout engines and checkpoints need; what it saves is the gradients' and the optimizer state's
memory, sharded over ranks.

Not owned here: starting the processes (`runtime.trainers`), which rank samples (rank 0's
rollout workers serve them all), the loss (`rl.grpo`).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from abc import ABC, abstractmethod

import torch
import torch.distributed as dist
from torch import nn

from longhaul.rl.registry import Registry

DATA_PARALLEL = Registry("data-parallel strategy")


class Forward(nn.Module):
    """`fn(policy, *args)` as a module's forward, so a wrapper's hooks around `__call__` fire."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, fn, *args, **kwargs):
        return fn(self.policy, *args, **kwargs)


def _zero_loss(policy: nn.Module) -> torch.Tensor:
    """0 x the sum of the trainable parameters: every one gets an exact zero gradient."""
    return sum(p.sum() for p in policy.parameters() if p.requires_grad) * 0.0


class DataParallel(ABC):
    """One rank's view of a data-parallel step. A strategy wraps the policy (`wrap`, once, before
    the optimizer is built over `parameters()`), skips the sync while accumulating, and publishes."""

    def __init__(self, group=None):
        self.group = group  # None: the default process group
        self.module: nn.Module | None = None

    def _scalars(self, values: list[float]) -> torch.Tensor:
        """`values` where the group reduces them: NCCL reduces only GPU tensors (this rank's GPU)."""
        device = torch.cuda.current_device() if dist.get_backend(self.group) == "nccl" else "cpu"
        return torch.tensor(values, dtype=torch.float64, device=device)

    def sum(self, values: list[float]) -> list[float]:
        t = self._scalars(values)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t.tolist()

    def max(self, value: float) -> float:
        t = self._scalars([value])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def forward(self, fn, *args, **kwargs):
        """`fn(policy, *args, **kwargs)` through the wrapped module (its gradients then sync)."""
        return self.module(fn, *args, **kwargs)

    def join(self) -> None:
        """The backward of a rank with nothing to train: zero gradients, the same sync as the others."""
        self.forward(_zero_loss).backward()

    def parameters(self):
        return self.module.parameters()

    @abstractmethod
    def wrap(self, policy: nn.Module) -> None:
        """Set `self.module`: a `Forward` over the policy (or a copy), wrapped for data parallel."""

    @abstractmethod
    def accumulate(self):
        """Context for a micro-batch's forward and backward that must not sync yet."""

    def publish(self, policy: nn.Module) -> None:
        """After the optimizer step: make `policy` hold the trained weights."""

    def optimizer_state_dict(self, optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer, state: dict, policy: nn.Module) -> None:
        """Load a saved optimizer state; `policy` holds the checkpoint's weights already."""
        optimizer.load_state_dict(state)


def _sum_hook(group, bucket):
    """DDP comm hook: the plain sum of a gradient bucket over ranks (the default averages)."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


@DATA_PARALLEL.register("ddp")
class DDP(DataParallel):
    """Full replicas; gradients all-reduced bucket by bucket, overlapped with the backward."""

    def wrap(self, policy: nn.Module) -> None:
        from torch.nn.parallel import DistributedDataParallel

        # no buffer sync in the forward: buffers (rotary tables) never change, and syncing them in every
        # forward would make ranks with different micro-batch counts wait on each other
        self.module = DistributedDataParallel(Forward(policy), process_group=self.group, forward_sync_buffers=False)
        self.module.register_comm_hook(self.group, _sum_hook)

    def accumulate(self):
        return self.module.no_sync()


@DATA_PARALLEL.register("fsdp2")
class FSDP2(DataParallel):
    """Parameters, gradients and optimizer state sharded over ranks (`fully_shard`, one unit)."""

    def wrap(self, policy: nn.Module) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        device = next(policy.parameters()).device.type
        mesh = DeviceMesh.from_group(self.group or dist.group.WORLD, device)
        self.module = fully_shard(Forward(copy.deepcopy(policy)), mesh=mesh)
        # a sum, not a mean; and SUM on the wire, since gloo has neither AVG nor PREMUL_SUM
        self.module.set_gradient_divide_factor(1.0)
        self.module.set_force_sum_reduction_for_comms(True)
        # the log-probs come back as views; the trainer never changes them in place, which is what this warns about
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPForward\) returned a view tensor")

    @contextlib.contextmanager
    def accumulate(self):
        # no reduce-scatter, and the gathered parameters are kept: the next forward needs no all-gather, so
        # ranks with different micro-batch counts run different numbers of forwards without waiting on each other
        self.module.set_requires_gradient_sync(False)
        self.module.set_reshard_after_backward(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)
            self.module.set_reshard_after_backward(True)

    def publish(self, policy: nn.Module) -> None:
        with torch.no_grad():
            for mine, full in zip(policy.parameters(), self.module.policy.parameters()):
                if mine.requires_grad:
                    mine.copy_(full.full_tensor())  # every rank gathers: full_tensor is a collective

    def optimizer_state_dict(self, optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(self.module, optimizer, options=StateDictOptions(full_state_dict=True))

    def load_optimizer_state_dict(self, optimizer, state: dict, policy: nn.Module) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        full = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.module, {f"policy.{k}": v for k, v in policy.state_dict().items()}, options=full)
        set_optimizer_state_dict(self.module, optimizer, state, options=full)


def shard(items: list, world: int) -> list[list]:
    """Contiguous, near-equal shards (the first ranks take one more when it does not divide)."""
    q, r = divmod(len(items), world)
    out, start = [], 0
    for k in range(world):
        n = q + (1 if k < r else 0)
        out.append(items[start:start + n])
        start += n
    return out
