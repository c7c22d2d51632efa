"""Data-parallel GRPO through torch's DDP and FSDP2: two gloo processes, each with its shard of
the groups, take the same step as one process with the whole batch (within 1e-5), including
steps where one rank trains nothing, has fewer micro-batches than the other, or gets no groups."""

import os
import sys
from contextlib import contextmanager

import pytest
import torch
import torch.multiprocessing as mp

from longhaul.config import AlgoConfig, TrainConfig
from longhaul.rl.distributed import shard
from longhaul.types import Trajectory, Turn

ALGO = AlgoConfig(kl_coef=0.04, clip_low=0.2, clip_high=0.28)
TRAIN = TrainConfig(lr=1e-3, micro_batch=2, autocast="none", grad_clip=1.0)
LORA = {"r": 4, "alpha": 16.0, "dropout": 0.0, "targets": ["q_proj", "v_proj", "down_proj"]}


def _groups(g, n_groups: int, same_from: int = 99, seed_offset: int = 0) -> list:
    """`n_groups` groups of 4 samples; groups from index `same_from` on have equal rewards."""
    groups = []
    for gi in range(n_groups):
        prompt = torch.randint(3, 200, (5 + gi,), generator=g).tolist()
        group = []
        for k in range(4):
            n = 3 + (k + gi + seed_offset) % 4
            ids = torch.randint(3, 200, (n,), generator=g).tolist()
            reward = 1.0 if gi >= same_from else float((k * 7 + gi + seed_offset) % 3) / 2
            group.append(Trajectory([Turn(prompt, ids, [-2.0] * n, [0] * n, [1] * n)], reward, gi))
        groups.append(group)
    return groups


def _batches() -> list:
    """Four steps for two ranks: 4 groups (even); 4 with the second half at equal rewards (rank 1
    trains nothing but must join the sync); 3 (rank 0 has twice rank 1's micro-batches); 1 (rank 1's
    shard is empty)."""
    g = torch.Generator().manual_seed(0)
    return [_groups(g, 4), _groups(g, 4, same_from=2), _groups(g, 3, seed_offset=1), _groups(g, 1, seed_offset=2)]


def _lora(policy):
    """The tiny model with `LORA` adapters. B starts at zero; a non-zero B gives the adapters' A a gradient too."""
    from longhaul.models.lora import apply_lora

    policy = apply_lora(policy, LORA["r"], LORA["alpha"], LORA["dropout"], LORA["targets"], "tiny-llama")
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(n)))
    return policy


def _trainer(dp=None, lora: bool = False, train: TrainConfig = TRAIN):
    from longhaul.models import load_policy
    from longhaul.rl.grpo import GRPOTrainer

    torch.manual_seed(0)
    policy, tok = load_policy("tiny-llama")
    if lora:
        policy = _lora(policy)
    return GRPOTrainer(policy, tok.pad_token_id, ALGO, train, 1.0, 8, dp=dp)


@contextmanager
def _gloo_group(rank: int, world: int, init: str):
    """One rank's gloo group. Every rank that finishes meets the others at a barrier before the
    teardown (as ShardedTrainer.close's last scatter does): a rank left in gloo's teardown while
    its peer was still saving hung past 180 s twice in a full make test, and one leaving while its
    peer still put its result aborted there in CI ("terminate called without an active exception")."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        yield
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Every rank's work is done and the ranks have met: leave without gloo's teardown, which still
    # aborted a rank that way in a full run on 2 loaded cores after its result was in (the result,
    # not the teardown, is what these tests check). A result put on a queue is flushed first.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _rank(rank: int, world: int, init: str, out, path: str, strategy: str, lora: bool, train: TrainConfig, batches) -> None:
    from longhaul.rl.distributed import DATA_PARALLEL

    torch.set_num_threads(1)
    with _gloo_group(rank, world, init):
        tr = _trainer(DATA_PARALLEL.get_fn(strategy)(), lora, train)
        metrics = [tr.step(shard(groups, world)[rank]) for groups in batches]
        state = tr.policy.state_dict()
        if rank == 0:  # tensors go through a file: a queue would share memory with a process about to exit
            torch.save(state, path)
            out.put(metrics)
            out.close()
            out.join_thread()


def _two_ranks(tmp_path, strategy: str, lora: bool = False, train: TrainConfig = TRAIN, batches=None):
    """Rank 0's metrics and final state dict after two gloo ranks train on `batches`."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    path = str(tmp_path / "rank0.pt")
    args = (out, path, strategy, lora, train, batches or _batches())
    procs = [ctx.Process(target=_rank, args=(r, 2, init, *args)) for r in range(2)]
    return _started(procs, out, timeout=300), torch.load(path)


def _started(procs, out, timeout: float):
    """Start the ranks, return what rank 0 put on `out`; a rank that fails or hangs is killed, never left behind."""
    for p in procs:
        p.start()
    try:
        got = out.get(timeout=timeout)
        for r, p in enumerate(procs):
            p.join(timeout=180)  # gloo's teardown on 2 loaded cores has taken over 60 s once in a full make test
            assert p.exitcode == 0, f"rank {r}: exit code {p.exitcode} (None: still running 180 s after rank 0's result)"
        return got
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def _assert_same(state: dict, ref: dict, start: dict) -> None:
    assert set(state) == set(ref), "a plain state dict (no `module.` prefixes, no shards)"
    worst = max((state[k] - ref[k]).abs().max().item() for k in ref)
    assert worst < 1e-5, f"max parameter difference {worst:.3g}"
    assert any((ref[k] - start[k]).abs().max() > 1e-4 for k in ref), "the weights moved"


KEYS = ("reward", "reward_std", "frac_reward_zero_std", "num_trained_seqs", "num_tokens", "kl", "loss", "grad_norm", "entropy",
        "clip_ratio/region_mean")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_gloo_ranks_equal_one_process_with_the_whole_batch(tmp_path, strategy):
    single = _trainer()
    start = {k: v.clone() for k, v in single.policy.state_dict().items()}
    ref_metrics = [single.step(groups) for groups in _batches()]
    metrics, state = _two_ranks(tmp_path, strategy)
    _assert_same(state, single.policy.state_dict(), start)
    for m, r in zip(metrics, ref_metrics):
        for key in KEYS:
            assert m[key] == pytest.approx(r[key], rel=1e-5, abs=1e-7), key
    assert ref_metrics[1]["frac_reward_zero_std"] == 0.5


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_lora_data_parallel_equals_one_process(tmp_path, strategy):
    single = _trainer(lora=True)
    start = {k: v.clone() for k, v in single.policy.state_dict().items()}
    ref_metrics = [single.step(groups) for groups in _batches()[:2]]
    metrics, state = _two_ranks(tmp_path, strategy, lora=True, batches=_batches()[:2])
    _assert_same(state, single.policy.state_dict(), start)
    frozen = [k for k in start if "lora_" not in k]
    assert frozen and all(torch.equal(state[k], start[k]) for k in frozen), "only the adapters train"
    assert [m["grad_norm"] for m in metrics] == pytest.approx([r["grad_norm"] for r in ref_metrics], rel=1e-5)


def test_two_accumulated_micro_batches_a_rank_equal_one_batch(tmp_path):
    """Each rank's 4 sequences in 2 micro-batches (the first under no_sync) vs one process's 8 in one."""
    g = torch.Generator().manual_seed(1)
    batches = [_groups(g, 2), _groups(g, 2, seed_offset=1)]
    single = _trainer(train=TRAIN.model_copy(update={"micro_batch": 8}))
    start = {k: v.clone() for k, v in single.policy.state_dict().items()}
    ref_metrics = [single.step(groups) for groups in batches]
    metrics, state = _two_ranks(tmp_path, "ddp", batches=batches)
    _assert_same(state, single.policy.state_dict(), start)
    assert [m["loss"] for m in metrics] == pytest.approx([r["loss"] for r in ref_metrics], rel=1e-5, abs=1e-7)


def _square_loss(model, row):
    return model(row).pow(2).sum()


def _grads(dp) -> list:
    """Full gradients of the wrapped parameters (FSDP2's are shards: gathered), as lists: a tensor
    sent through a queue would share memory with a process about to exit."""
    return [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).tolist() for p in dp.parameters()]


def _accumulate_rank(rank: int, init: str, out) -> None:
    """On a tiny linear layer, per strategy: the gradient after an `accumulate()` backward, and after the synced one."""
    from longhaul.rl.distributed import DATA_PARALLEL

    with _gloo_group(rank, 2, init):
        got = {}
        for name in ("ddp", "fsdp2"):
            torch.manual_seed(0)
            dp = DATA_PARALLEL.get_fn(name)()
            dp.wrap(torch.nn.Linear(3, 2))
            x = torch.arange(12.0).view(2, 2, 3)[rank]  # rank r's two micro-batches, one row each
            with dp.accumulate():
                dp.forward(_square_loss, x[0]).backward()
            local = _grads(dp) if name == "ddp" else None  # FSDP2 holds no full gradient before its reduce-scatter
            dp.forward(_square_loss, x[1]).backward()
            got[name] = (local, _grads(dp))
        if rank == 0:
            out.put(got)
            out.close()
            out.join_thread()


def test_accumulate_defers_the_gradient_sum_to_the_last_backward(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    x = torch.arange(12.0).view(4, 3)
    layer(x[:1]).pow(2).sum().backward()
    first = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    layer(x).pow(2).sum().backward()  # all four rows: both ranks' two micro-batches, summed
    total = [p.grad.clone() for p in layer.parameters()]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_accumulate_rank, args=(r, f"file://{tmp_path / 'rendezvous'}", out)) for r in range(2)]
    got = _started(procs, out, timeout=120)
    local, _ = got["ddp"]
    assert all(torch.allclose(torch.tensor(a), b, atol=1e-6) for a, b in zip(local, first)), "no_sync: rank 0's own gradient only"
    # Relative: the summed gradients are 11-131 (an fp32 ulp up to 1.5e-5), each a sum of four
    # rows' terms that the ranks and this process add in different orders with whatever fp32 GEMM
    # the host picks, so they agree to a few ulps of their size (an absolute 1e-5 failed on
    # Sapphire Rapids at 1.53e-5, one ulp). rtol 1e-5 is ~80 fp32 eps; a lost or doubled
    # micro-batch is off by over 1%. atol only for entries near zero.
    for name, (_, synced) in got.items():
        for a, b in zip(synced, total):
            torch.testing.assert_close(torch.tensor(a), b, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: summed gradient\n{m}")


def test_shard_is_contiguous_and_covers_everything():
    assert shard(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert shard([1], 2) == [[1], []]
