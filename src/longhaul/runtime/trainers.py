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
from longhaul.malloc import keep_freed_memory
from longhaul.models import load_policy
from longhaul.models.lora import apply_lora
from longhaul.rl.checkpoint import load_trainer_state, load_weights
from longhaul.rl.distributed import DATA_PARALLEL, shard
from longhaul.rl.grpo import GRPOTrainer
from longhaul.runtime.notice import leave_to_the_parent


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _init(rank: int, world: int, init: str) -> None:
    dist.init_process_group(_backend(), init_method=init, rank=rank, world_size=world)


def _build(cfg, dp, ckpt: str | None):

    policy, tok = load_policy(cfg.model.name)
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


def _follower(cfg_json: str, rank: int, world: int, init: str, ckpt: str | None, threads: int | None) -> None:

    keep_freed_memory()
    leave_to_the_parent()
    if threads:
        torch.set_num_threads(threads)
    cfg = RunConfig.model_validate_json(cfg_json)
    torch.manual_seed(cfg.seed)
    _init(rank, world, init)
    try:
        trainer = _build(cfg, _strategy(cfg), ckpt)
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


class ShardedTrainer:
    """Rank 0's trainer of a data-parallel run; followers run in child processes."""

    def __init__(self, cfg, policy, tok, ckpt: Path | None = None):
        import torch.multiprocessing as mp

        self.world = cfg.runtime.trainers
        self._dir = tempfile.mkdtemp(prefix="longhaul-dp-")
        init = f"file://{os.path.join(self._dir, 'rendezvous')}"
        ctx = mp.get_context("spawn")
        threads = cfg.threads or max(1, torch.get_num_threads() // self.world)
        self.procs = [ctx.Process(target=_follower, name=f"longhaul-trainer-{r}", daemon=True,
                                  args=(cfg.model_dump_json(), r, self.world, init, str(ckpt) if ckpt else None, threads))
                      for r in range(1, self.world)]
        for p in self.procs:
            p.start()
        _init(0, self.world, init)
        self.inner = GRPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature, cfg.rollout.max_new_tokens,
                                 dp=_strategy(cfg))

    def _scatter(self, parts: list):
        if any(not p.is_alive() for p in self.procs):
            raise LonghaulError("a data-parallel trainer process died; see its error above, then --resume from the last checkpoint")
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
        try:
            if dist.is_initialized():
                try:
                    dist.scatter_object_list([None], [None] * self.world, src=0)
                finally:
                    dist.destroy_process_group()
            for p in self.procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)  # the rendezvous file's directory
