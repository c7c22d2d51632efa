"""Data-parallel trainers for a run: `runtime.trainers: N` starts N-1 follower processes beside
this one, joins them in a gloo (CPU) or NCCL (GPU) process group, and gives the controller one
trainer with the usual `step` / `state_dict` / `load_state_dict`.

Rank 0 (this process) keeps the rollouts, the logging and the checkpoints. Each step it splits
the batch's groups into N contiguous shards (`rl.distributed.shard`) and scatters them; every
rank takes the same step on its shard (`GRPOTrainer` with the `runtime.data_parallel` strategy,
DDP or FSDP2, sums counts and gradients over ranks), so rank 0's weights are the run's. Saving
the trainer's state is a collective too (FSDP2 gathers the sharded optimizer state), so rank 0
scatters a request for it and every rank answers. A follower that was started for a resumed run
loads the same checkpoint first.

Not owned here: the maths of the sharded step (`rl.grpo`, `rl.distributed`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from longhaul.config import RunConfig
from longhaul.errors import LonghaulError
from longhaul.hardware import resolve_device
from longhaul.malloc import keep_freed_memory
from longhaul.models import load_policy
from longhaul.models.lora import apply_lora
from longhaul.rl.checkpoint import load_trainer_state, load_weights
from longhaul.rl.distributed import DATA_PARALLEL, shard
from longhaul.rl.grpo import GRPOTrainer
from longhaul.runtime.notice import leave_to_the_parent


def join_group(rank: int, world: int, init: str, device: str = "cpu") -> None:
    """Join the run's trainer process group as `rank` of `world` (rendezvous at the `init` URL):
    gloo where the ranks train on CPUs, NCCL on GPUs, where rank r first takes GPU r (modulo the
    GPUs there are)."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)


def rank_device(cfg, rank: int) -> str:
    """Where rank `rank` trains: train.device, each rank on its own GPU when that is CUDA."""
    device = resolve_device(cfg.train.device)
    return f"cuda:{rank % torch.cuda.device_count()}" if device == "cuda" else device


def _build(cfg, dp, ckpt: str | None, rank: int):

    policy, tok = load_policy(cfg.model.name, cfg.model.rope_scaling, rank_device(cfg, rank))
    t = cfg.train
    if t.lora_r:
        policy = apply_lora(policy, t.lora_r, t.lora_alpha, t.lora_dropout, t.lora_targets, cfg.model.name)
    trainer = GRPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature, cfg.rollout.max_new_tokens, dp=dp)
    if ckpt is not None:
        load_weights(policy, Path(ckpt))
        trainer.load_state_dict(load_trainer_state(Path(ckpt)))
    return trainer


STATE = "state_dict"  # rank 0's request that every rank take part in `state_dict`


def _strategy(cfg):

    return DATA_PARALLEL.get_fn(cfg.runtime.data_parallel)()


def _follower(rank: int, world: int, init: str, cfg_json: str, ckpt: str | None, threads: int | None) -> None:

    keep_freed_memory()
    leave_to_the_parent()
    if threads:
        torch.set_num_threads(threads)
    cfg = RunConfig.model_validate_json(cfg_json)
    torch.manual_seed(cfg.seed)
    join_group(rank, world, init, rank_device(cfg, rank))
    try:
        trainer = _build(cfg, _strategy(cfg), ckpt, rank)
        while True:
            box = [None]
            dist.scatter_object_list(box, None, src=0)
            if box[0] is None:
                break
            if box[0] == STATE:
                trainer.state_dict()
            else:
                trainer.step(box[0])
    finally:
        dist.destroy_process_group()


class Followers:
    """Ranks 1 .. world - 1 of a run's trainer group in child processes (spawned, daemons), with this
    process as rank 0: `start` spawns them and joins the group, `check_alive` refuses to talk to a
    group that lost one, `stop` sends the farewell they wait for, leaves the group and reaps them."""

    def __init__(self, world: int, name: str, device: str = "cpu"):
        self.world, self.name, self.procs, self.device = world, name, [], device
        self._dir = tempfile.mkdtemp(prefix="longhaul-group-")
        self.init = f"file://{os.path.join(self._dir, 'rendezvous')}"

    def start(self, target, *args) -> None:
        """`target(rank, world, init, *args)` in a process for each follower rank; then join as rank 0."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.procs = [ctx.Process(target=target, name=f"longhaul-{self.name}-{r}", daemon=True, args=(r, self.world, self.init, *args))
                      for r in range(1, self.world)]
        for p in self.procs:
            p.start()
        join_group(0, self.world, self.init, self.device)

    def check_alive(self) -> None:
        if any(not p.is_alive() for p in self.procs):
            raise LonghaulError(f"a {self.name} process died; see its error above, then --resume from the last checkpoint")

    def stop(self, farewell) -> None:
        """`farewell()`: the collective that tells the followers to leave their loop."""
        try:
            if dist.is_initialized():
                try:  # a follower that died has torn down its end: a farewell would wait on it
                    if all(p.is_alive() for p in self.procs):
                        farewell()
                finally:
                    dist.destroy_process_group()
            for p in self.procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)  # the rendezvous file's directory


class ShardedTrainer:
    """Rank 0's trainer of a data-parallel run; followers run in child processes."""

    def __init__(self, cfg, policy, tok, ckpt: Path | None = None):
        self.world = cfg.runtime.trainers
        threads = cfg.threads or max(1, torch.get_num_threads() // self.world)
        self.followers = Followers(self.world, "data-parallel trainer", rank_device(cfg, 0))
        self.followers.start(_follower, cfg.model_dump_json(), str(ckpt) if ckpt else None, threads)
        self.inner = GRPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature, cfg.rollout.max_new_tokens,
                                 dp=_strategy(cfg))

    def _scatter(self, parts: list):
        self.followers.check_alive()
        box = [None]
        dist.scatter_object_list(box, parts, src=0)
        return box[0]

    def step(self, groups: list) -> dict:

        return self.inner.step(self._scatter(shard(groups, self.world)))

    def state_dict(self) -> dict:
        self._scatter([STATE] * self.world)
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def close(self) -> None:
        self.followers.stop(lambda: dist.scatter_object_list([None], [None] * self.world, src=0))
