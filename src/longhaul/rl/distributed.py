"""Data-parallel training over torch.distributed (gloo on CPU, NCCL on GPU).

Each rank holds a full replica of the policy, the same optimizer state and a shard of the
batch (whole groups, so group baselines stay exact). A trainer asks `DataParallel` for the
batch-wide normalisers (token and sequence counts summed over ranks) so every rank's loss is
already its share of the global mean, then sums the gradients over ranks bucket by bucket,
exactly as DDP's reducer does, and takes the same clipped optimizer step everywhere. The
update therefore equals one process's update on the whole batch (to float rounding; tested
within 1e-5), and replicas never drift.

Not owned here: starting the processes (`runtime.trainers`), which rank samples (rank 0's
rollout workers serve them all).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

BUCKET_BYTES = 25 << 20  # DDP's default bucket size


class DataParallel:
    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

    def sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t.tolist()

    def max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def allreduce_grads(self, params) -> None:
        """Sum every trainable parameter's gradient over ranks (a rank that had no data sends zeros)."""
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket, size = [], 0
        for p in params:
            bucket.append(p)
            size += p.grad.numel() * p.grad.element_size()
            if size >= BUCKET_BYTES:
                self._reduce(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce(bucket)

    def _reduce(self, bucket) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n


def shard(items: list, world: int) -> list[list]:
    """Contiguous, near-equal shards (the first ranks take one more when it does not divide)."""
    q, r = divmod(len(items), world)
    out, start = [], 0
    for k in range(world):
        n = q + (1 if k < r else 0)
        out.append(items[start:start + n])
        start += n
    return out
