"""Context-parallel trainers for an SFT, DPO or GRPO run: `train.context_parallel: N` starts N-1 follower
processes beside this one in one process group (`runtime.trainers.Followers`) and gives the run
loop one trainer with the usual `step` / `evaluate` / `state_dict` / `load_state_dict`, and `close`.

Rank 0 (this process) keeps the data (or the rollouts), the logging and the checkpoints. Each step
it broadcasts the rows (GRPO: the step's groups); every rank runs `SFTTrainer` (`GRPOTrainer`, or
`DPOTrainer`, which first gets every item rank 0 has, to score its reference on) with a
`ContextGroup` over the whole group, on its zigzag shard of each packed micro-batch, and takes
the same optimizer step on the gradient summed over the group, so the weights stay equal on
every rank and rank 0's are the run's. The followers start from rank 0's
trainable weights (broadcast once); on resume each reads the checkpoint rank 0 resumes from.

An online GRPO run may also set `runtime.trainers: D` (data parallel): the process group then
holds D replicas of the context group, N * D processes (`context_parallel.packed.grid`), and each
replica trains its contiguous share of the step's groups (`rl.distributed.shard`), as data-parallel
trainers do; every rank's gradient enters the one sum, so the replicas stay equal too.

Owns the followers' loop, the commands rank 0 sends them, and the checks of a run's config and
model (`check`) before any process starts. Not owned here: the split and its maths
(`rl.context_parallel.packed`), data-parallel trainers without a context split (`runtime.trainers`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from longhaul.config import RunConfig
from longhaul.errors import LonghaulError
from longhaul.hardware import resolve_device
from longhaul.malloc import keep_freed_memory
from longhaul.models import load_policy
from longhaul.models.lora import apply_lora
from longhaul.rl.checkpoint import load_trainer_state, load_weights
from longhaul.rl.distributed import shard
from longhaul.rl.context_parallel.packed import check_model, grid
from longhaul.rl.dpo import DPOTrainer
from longhaul.rl.grpo import GRPOTrainer
from longhaul.rl.grpo import check_context as check_grpo
from longhaul.rl.sft import SFTTrainer
from longhaul.runtime.notice import leave_to_the_parent
from longhaul.runtime.trainers import Followers, join_group


def check(cfg: RunConfig, splits: bool, policy=None) -> None:
    """One-line errors for a context-parallel config the run cannot take; `splits`: the algorithm's
    trainer splits its rows (SFT, DPO, GRPO); `policy`: the model too (`context_parallel.packed.check_model`)."""
    n = cfg.train.context_parallel
    if n == 1:
        return
    if resolve_device(cfg.train.device) != "cpu":
        raise LonghaulError(f"train.context_parallel={n} runs its ranks on CPUs (gloo); on a GPU set train.device=cpu, or "
                            f"train.context_parallel=1")
    if not splits:
        raise LonghaulError(f"train.context_parallel={n} splits packed SFT rows, DPO answers and GRPO's (prompt, completion) rows; "
                            f"algo.name={cfg.algo.name} does not take it; set train.context_parallel=1")
    if cfg.runtime.trainers > 1 and cfg.algo.name != "grpo":
        raise LonghaulError(f"runtime.trainers={cfg.runtime.trainers} (data-parallel replicas) combines with "
                            f"train.context_parallel for algo.name=grpo only, not {cfg.algo.name}; set runtime.trainers=1")
    if cfg.algo.name == "grpo":
        check_grpo(cfg.algo)
        if cfg.runtime.trainers > 1 and cfg.runtime.data_parallel != "ddp":
            raise LonghaulError(f"train.context_parallel={n} keeps a full replica of the model on every rank, so its "
                                f"data-parallel replicas sum gradients like ddp, not runtime.data_parallel="
                                f"{cfg.runtime.data_parallel}; set runtime.data_parallel=ddp")
    elif not cfg.data.packing:
        raise LonghaulError(f"train.context_parallel={n} splits each packed row over {n} processes; set data.packing=true")
    if policy is not None:
        check_model(policy, n, cfg.train.context_attention)


def _trainer(cfg: RunConfig, policy, tok, items: list | None):
    """This rank's trainer over the whole group, from rank 0's trainable weights (and for DPO, rank
    0's `items`: the followers pass None and receive them)."""
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:  # the rest comes from the same file (or seed) on every rank
                dist.broadcast(p.data, src=0)
    context, replica, replicas = grid(cfg.train.context_attention, cfg.train.context_parallel)
    if cfg.algo.name == "grpo":  # every rank of a context group gets its replica's share of each step's groups
        return _Replica(GRPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature,
                                    cfg.rollout.max_new_tokens, context=context), replica, replicas)
    if cfg.algo.name == "dpo":
        box = [items]
        dist.broadcast_object_list(box, src=0)
        return DPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, box[0], context=context)
    return SFTTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.data.packing, cfg.data.pack_length or cfg.data.max_length,
                      context=context)


class _Replica:
    """A GRPO trainer of one data-parallel replica: `step` gets every group of a step and trains
    the replica's share (all of them when the context group is the only one)."""

    def __init__(self, trainer: GRPOTrainer, index: int, count: int):
        self.trainer, self.index, self.count = trainer, index, count

    def step(self, groups: list) -> dict:
        return self.trainer.step(shard(groups, self.count)[self.index])

    def __getattr__(self, name):
        return getattr(self.trainer, name)


def _follower(rank: int, world: int, init: str, cfg_json: str, threads: int) -> None:
    keep_freed_memory()
    leave_to_the_parent()
    torch.set_num_threads(threads)
    cfg = RunConfig.model_validate_json(cfg_json)
    torch.manual_seed(cfg.seed)
    join_group(rank, world, init)
    try:
        policy, tok = load_policy(cfg.model.name, cfg.model.rope_scaling)
        t = cfg.train
        if t.lora_r:
            policy = apply_lora(policy, t.lora_r, t.lora_alpha, t.lora_dropout, t.lora_targets, cfg.model.name)
        trainer = _trainer(cfg, policy, tok, None)
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                break
            kind, arg = box[0]
            if kind == "load":  # arg: the step of the checkpoint rank 0 resumed from
                path = cfg.run_dir / "checkpoints" / f"step_{arg}"
                load_weights(policy, path)
                trainer.load_state_dict(load_trainer_state(path))
            else:
                getattr(trainer, kind)(arg)
    finally:
        dist.destroy_process_group()


class ContextParallelTrainer:
    """Rank 0's SFT, DPO or GRPO trainer of a context-parallel run; the other ranks run in child processes."""

    def __init__(self, cfg: RunConfig, policy, tok, items: list | None = None):
        self.world = cfg.train.context_parallel * cfg.runtime.trainers  # every replica's ranks
        check_model(policy, cfg.train.context_parallel, cfg.train.context_attention)  # here, before any process starts
        self.threads = cfg.threads or max(1, torch.get_num_threads() // self.world)  # the ranks share the cores
        self.followers = Followers(self.world, "context-parallel trainer")
        self.followers.start(_follower, cfg.model_dump_json(), self.threads)
        with self._sharing():
            self.inner = _trainer(cfg, policy, tok, items)

    @contextlib.contextmanager
    def _sharing(self):
        """This rank's share of the cores while the group works (an online run's rollouts, between
        steps, keep every core)."""
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def _tell(self, kind: str, arg) -> None:
        self.followers.check_alive()
        dist.broadcast_object_list([(kind, arg)], src=0)

    def step(self, rows: list) -> dict:
        """One optimizer step over `rows` (an online run: the step's groups), on every rank."""
        self._tell("step", rows)
        with self._sharing():
            return self.inner.step(rows)

    def evaluate(self, rows: list) -> dict:
        self._tell("evaluate", rows)
        with self._sharing():
            return self.inner.evaluate(rows)

    def state_dict(self) -> dict:
        return self.inner.state_dict()  # the optimizer's state is the same on every rank

    def load_state_dict(self, state: dict) -> None:
        """`state` is a checkpoint's trainer state (with its `step`); the followers read that checkpoint."""
        self._tell("load", state["step"])
        self.inner.load_state_dict(state)

    def close(self) -> None:
        self.followers.stop(lambda: dist.broadcast_object_list([None], src=0))
