"""Data-parallel GRPO: two gloo processes, each with half the groups, take the same step as one
process with the whole batch (within 1e-5), including a step where one rank has nothing to train."""

import pytest
import torch
import torch.multiprocessing as mp

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.rl.distributed import shard
from longhaul.types import Trajectory, Turn

ALGO = AlgoConfig(kl_coef=0.04, clip_low=0.2, clip_high=0.28)
TRAIN = TrainConfig(lr=1e-3, micro_batch=2, autocast="none", grad_clip=1.0)


def _batches():
    """Two steps of 4 groups x 4 samples. In step 2 the second half's groups have equal rewards
    (rank 1 then trains on nothing but must still join the all-reduce)."""
    g = torch.Generator().manual_seed(0)
    steps = []
    for step in range(2):
        groups = []
        for gi in range(4):
            prompt = torch.randint(3, 200, (5 + gi,), generator=g).tolist()
            same = step == 1 and gi >= 2
            group = []
            for k in range(4):
                n = 3 + (k + gi) % 4
                ids = torch.randint(3, 200, (n,), generator=g).tolist()
                group.append(Trajectory([Turn(prompt, ids, [-2.0] * n, [0] * n, [1] * n)], 1.0 if same else float((k * 7 + gi) % 3) / 2, gi))
            groups.append(group)
        steps.append(groups)
    return steps


def _trainer(dp=None):
    from longhaul.models import load_policy
    from longhaul.rl.grpo import GRPOTrainer

    torch.manual_seed(0)
    policy, tok = load_policy("tiny-llama")
    return GRPOTrainer(policy, tok.pad_token_id, ALGO, TRAIN, 1.0, 8, dp=dp)


def _rank(rank: int, world: int, init: str, out, path: str) -> None:
    import torch.distributed as dist

    from longhaul.rl.distributed import DataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        tr = _trainer(DataParallel())
        metrics = [tr.step(shard(groups, world)[rank]) for groups in _batches()]
        if rank == 0:  # tensors go through a file: a queue would share memory with a process about to exit
            torch.save(tr.policy.state_dict(), path)
            out.put(metrics)
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_equal_one_process_with_the_whole_batch(tmp_path):
    single = _trainer()
    ref_metrics = [single.step(groups) for groups in _batches()]
    ref = single.policy.state_dict()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    path = str(tmp_path / "rank0.pt")
    procs = [ctx.Process(target=_rank, args=(r, 2, init, out, path)) for r in range(2)]
    for p in procs:
        p.start()
    metrics = out.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    state = torch.load(path)
    worst = max((state[k] - ref[k]).abs().max().item() for k in ref)
    assert worst < 1e-5, f"max parameter difference {worst:.3g}"
    assert any((state[k] - _trainer().policy.state_dict()[k]).abs().max() > 1e-4 for k in ref), "the weights moved"
    for m, r in zip(metrics, ref_metrics):
        for key in ("reward", "reward_std", "frac_reward_zero_std", "num_trained_seqs", "num_tokens", "kl", "loss", "grad_norm",
                    "entropy", "clip_ratio/region_mean"):
            assert m[key] == pytest.approx(r[key], rel=1e-5, abs=1e-7), key
    assert ref_metrics[1]["frac_reward_zero_std"] == 0.5


def test_shard_is_contiguous_and_covers_everything():
    assert shard(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert shard([1], 2) == [[1], []]
