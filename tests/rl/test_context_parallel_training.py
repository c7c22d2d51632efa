"""Context-parallel SFT and DPO (`train.context_parallel`, `rl.context_parallel.packed`): two gloo
processes, each running its zigzag shard of every packed micro-batch, give one process's loss and
parameter gradients, by ring and by Ulysses attention, full fine-tuning and LoRA, with each shard's
layers kept or recomputed in the backward (DPO: the sigmoid
loss on summed log-probs and IPO on per-token means, against the padded single-process path; GRPO
over three optimizer steps, its weights and metrics),
over packed micro-batches
of several documents (two micro-batches accumulated, one padded to the 2N chunks) and over a row
whose loss tokens all sit on rank 0 (rank 1 still joins the backward). An SFT run with
`train.context_parallel=2` trains like one process, and so do GRPO steps on two data-parallel
replicas of a two-rank group. And the one-line errors."""

import json

import pytest
import torch
import torch.multiprocessing as mp

from longhaul.config import AlgoConfig, TrainConfig, load_config
from longhaul.errors import LonghaulError
from longhaul.rl.context_parallel.blocks import SEES
from longhaul.rl.context_parallel.packed import check_split, document_ids
from longhaul.rl import packed_forward
from longhaul.rl.packed_forward import CHECKPOINT_ROWS, pack_shared
from longhaul.runtime.context_trainers import check
from tests.rl.test_distributed import _batches, _gloo_group, _lora, _started

TRAIN = TrainConfig(lr=1e-3, micro_batch=2, autocast="none")
CASES = {"ring": ("ring", False), "ulysses": ("ulysses", False), "ring lora": ("ring", True)}  # (attention, lora)
RECOMPUTED = {"ring recomputed": "ring", "ulysses recomputed": "ulysses"}  # each shard's layers recomputed in backward
# fp32: the shards' ring / Ulysses blocks against SDPA over whole rows, and the gradients summed over
# two ranks in another order (measured: loss 6e-8 relative, gradients 4e-7 of the largest entry)
TOL_LOSS, TOL_GRAD = 1e-5, 1e-5


def _rows() -> dict[str, list]:
    """"several": six rows (prompt tokens masked out), packed into bins of 40 tokens: two micro-batches,
    79 and 18 tokens, the first padded from 75 flat rows to 76. "lone": one row of 17 tokens whose
    loss tokens 2-4 are predicted by flat rows 1-3, all in rank 0's first zigzag chunk."""
    g = torch.Generator().manual_seed(0)
    several = []
    for n, prompt in ((23, 8), (17, 5), (12, 4), (9, 3), (30, 11), (6, 2)):
        several.append((torch.randint(3, 200, (n,), generator=g).tolist(), [0] * prompt + [1] * (n - prompt)))
    lone = [(torch.randint(3, 200, (17,), generator=g).tolist(), [0, 0, 1, 1, 1] + [0] * 12)]
    return {"several": several, "lone": lone}


def _trainer(attention: str | None, lora: bool, packing: bool = True):
    from longhaul.models import load_policy
    from longhaul.rl.context_parallel.packed import ContextGroup
    from longhaul.rl.sft import SFTTrainer

    torch.manual_seed(0)  # the adapters' A: the same in every process
    policy, tok = load_policy("tiny-llama")
    if lora:
        policy = _lora(policy)
    context = ContextGroup(attention) if attention else None
    return SFTTrainer(policy, tok.pad_token_id, AlgoConfig(name="sft"), TRAIN, packing=packing, max_length=40, context=context)


def _gradients(trainer, rows) -> tuple[float, dict]:
    """The batch's loss and the trainable parameters' gradients after one `backward`."""
    loss = trainer.backward(rows)
    loss = loss["loss"] if isinstance(loss, dict) else loss
    return loss, {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


DPO_CASES = {"dpo sigmoid ring": ("sigmoid", "ring"), "dpo ipo_norm ulysses": ("ipo_norm", "ulysses")}  # (loss, attention)


def _pairs() -> list:
    """Five (chosen, rejected) pairs sharing a prompt (masked out), answers of 2-9 tokens; micro-batches
    of two pairs: three of them, the last a single pair."""
    g = torch.Generator().manual_seed(1)
    out = []
    for prompt, nc, nr in ((6, 4, 7), (9, 2, 5), (4, 9, 3), (7, 5, 5), (3, 3, 8)):
        p = torch.randint(3, 200, (prompt,), generator=g).tolist()
        c, r = (torch.randint(3, 200, (n,), generator=g).tolist() for n in (nc, nr))
        out.append(((p + c, [0] * prompt + [1] * nc), (p + r, [0] * prompt + [1] * nr)))
    return out


def _dpo_trainer(loss: str, attention: str | None):
    from longhaul.models import load_policy
    from longhaul.rl.context_parallel.packed import ContextGroup
    from longhaul.rl.dpo import DPOTrainer

    policy, tok = load_policy("tiny-llama")
    context = ContextGroup(attention) if attention else None
    trainer = DPOTrainer(policy, tok.pad_token_id, AlgoConfig(name="dpo", dpo_loss=loss), TRAIN, _pairs(), context=context)
    with torch.no_grad():  # the policy moves away from its reference, so the loss depends on every score
        for p in policy.parameters():
            p.mul_(1.05)
    return trainer


# GRPO: a KL term and clip-higher over three steps, token-mean by ring; per-sequence means (their
# whole rows' token counts, not a rank's share) by Ulysses; a group's prompt once in the row it
# shares with its completions (train.share_prompt), by ring. (algo, attention, share_prompt)
GRPO_CASES = {"grpo token-mean ring": (AlgoConfig(kl_coef=0.04, clip_low=0.2, clip_high=0.28), "ring", False),
              "grpo seq-mean ulysses": (AlgoConfig(kl_coef=0.04, aggregation="seq-mean-token-mean"), "ulysses", False),
              "grpo shared prompt ring": (AlgoConfig(kl_coef=0.04, clip_low=0.2, clip_high=0.28), "ring", True)}
GRPO_TRAIN = TrainConfig(lr=1e-3, micro_batch=2, autocast="none", grad_clip=1.0, share_prompt=False, context_parallel=2)
GRPO_KEYS = ("reward", "num_trained_seqs", "num_tokens", "kl", "loss", "grad_norm", "entropy", "clip_ratio/region_mean")


def _grpo_trainer(algo: AlgoConfig, share: bool, context=None):
    """One rank's GRPO trainer of a `context` group (a `ContextGroup`), or with None one process's."""
    from longhaul.models import load_policy
    from longhaul.rl.grpo import GRPOTrainer

    torch.manual_seed(0)
    policy, tok = load_policy("tiny-llama")
    train = GRPO_TRAIN.model_copy(update={"share_prompt": share, "context_parallel": 1 if context is None else 2})
    return GRPOTrainer(policy, tok.pad_token_id, algo, train, 1.0, 8, context=context)


def _grpo_steps(trainer, steps: int = 3) -> tuple[list[dict], dict]:
    """Metrics of `steps` steps (every rank, or replica, gets all the groups) and the weights after them."""
    metrics = [trainer.step(groups) for groups in _batches()[:steps]]
    return metrics, {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}


def _rank(rank: int, world: int, init: str, path: str, out) -> None:
    from longhaul.rl.context_parallel.packed import ContextGroup

    torch.set_num_threads(1)
    with _gloo_group(rank, world, init):
        got = {(case, name): _gradients(_trainer(attention, lora), rows)
               for case, (attention, lora) in CASES.items() for name, rows in _rows().items()}
        got |= {(case, "pairs"): _gradients(_dpo_trainer(loss, attention), _pairs()) for case, (loss, attention) in DPO_CASES.items()}
        packed_forward.CHECKPOINT_ROWS = 8  # every shard of "several" recomputes: collectives inside the backward
        got |= {(case, "several"): _gradients(_trainer(attention, False), _rows()["several"]) for case, attention in RECOMPUTED.items()}
        packed_forward.CHECKPOINT_ROWS = CHECKPOINT_ROWS
        got |= {(case, "grpo"): _grpo_steps(_grpo_trainer(algo, share, ContextGroup(attention)))
                for case, (algo, attention, share) in GRPO_CASES.items()}
        try:
            _trainer("ring", False, packing=False)
            refused = ""
        except LonghaulError as e:
            refused = str(e)
        if rank == 0:  # tensors go through a file: a queue would share memory with a process about to exit
            torch.save(got, path)
            out.put(refused)
            out.close()
            out.join_thread()


def test_two_ranks_give_one_process_loss_and_gradients(tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init, path = f"file://{tmp_path / 'rendezvous'}", str(tmp_path / "rank0.pt")
    procs = [ctx.Process(target=_rank, args=(r, 2, init, path, out)) for r in range(2)]
    refused = _started(procs, out, timeout=240)
    got = torch.load(path)
    lines, bad = [], []
    for (case, name), (loss, grads) in got.items():
        if case in GRPO_CASES:
            continue
        if case in DPO_CASES:
            ref_loss, ref = _gradients(_dpo_trainer(DPO_CASES[case][0], None), _pairs())
        elif case in RECOMPUTED:
            ref_loss, ref = _gradients(_trainer(None, False), _rows()[name])
        else:
            ref_loss, ref = _gradients(_trainer(None, CASES[case][1]), _rows()[name])
        scale = max(g.abs().max().item() for g in ref.values())
        d_loss = abs(loss - ref_loss) / abs(ref_loss)
        d_grad = max((grads[n] - ref[n]).abs().max().item() for n in ref) / scale
        assert grads.keys() == ref.keys()
        lines.append(f"{case:20} {name:7} loss {ref_loss:.5f} rel diff {d_loss:.2e}  grads max diff / max |grad| {d_grad:.2e}")
        bad += [lines[-1]] if d_loss > TOL_LOSS or d_grad > TOL_GRAD else []
    print("context_parallel=2 against one process:\n" + "\n".join(lines))
    assert not bad, f"over loss {TOL_LOSS:g} / gradients {TOL_GRAD:g}:\n" + "\n".join(bad)
    assert refused == "train.context_parallel splits each packed row over its processes; set data.packing=true"
    for case, (algo, _, share) in GRPO_CASES.items():  # GRPO: three optimizer steps, weights and metrics as one process's
        _assert_grpo_equal(case, got[(case, "grpo")], _grpo_steps(_grpo_trainer(algo, share)))


def _assert_grpo_equal(case: str, got: tuple[list[dict], dict], ref: tuple[list[dict], dict]) -> None:
    """Split steps' (metrics, weights) against one process's: weights within 3e-5, metrics 1e-5 relative.
    Adam's step turns the rounding of a near-zero gradient into up to lr (1e-3) where a wrong
    gradient moves weights by ~lr each step; measured up to 1.6e-5 (a shared prompt's row sums its
    attention in another order than the one-process path)."""
    (metrics, weights), (ref_metrics, ref) = got, ref
    worst = max((weights[n] - ref[n]).abs().max().item() for n in ref)
    print(f"{case}: max parameter difference after {len(metrics)} steps {worst:.2e}")
    assert worst < 3e-5, f"{case}: max parameter difference {worst:.3g}"
    for m, r in zip(metrics, ref_metrics, strict=True):
        for key in GRPO_KEYS:
            assert m[key] == pytest.approx(r[key], rel=1e-5, abs=1e-7), (case, key)


def _replica_rank(rank: int, world: int, init: str, path: str, out) -> None:
    """A rank of two data-parallel replicas of a two-rank context group: four GRPO steps per case."""
    from longhaul.rl.context_parallel.packed import grid
    from longhaul.runtime.context_trainers import _Replica

    torch.set_num_threads(1)
    with _gloo_group(rank, world, init):
        got = {}
        for case, (algo, attention, share) in GRPO_CASES.items():
            context, replica, replicas = grid(attention, 2)
            got[case] = _grpo_steps(_Replica(_grpo_trainer(algo, share, context), replica, replicas), steps=4)
        if rank == 0:
            torch.save(got, path)
            out.put("done")
            out.close()
            out.join_thread()


def test_data_parallel_replicas_of_a_context_group_train_like_one_process(tmp_path):
    """Four ranks, two replicas of a two-rank group (`grid`): each replica trains its half of a
    step's groups (4, 4 with half at equal rewards, 3, and 1: replica 1 then has none but joins
    the sums), every row split over its replica's two ranks. Four steps equal one process's."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init, path = f"file://{tmp_path / 'rendezvous'}", str(tmp_path / "rank0.pt")
    procs = [ctx.Process(target=_replica_rank, args=(r, 4, init, path, out)) for r in range(4)]
    assert _started(procs, out, timeout=240) == "done"
    got = torch.load(path)
    for case, (algo, _, share) in GRPO_CASES.items():
        _assert_grpo_equal(f"{case}, 2 replicas x 2 ranks", got[case], _grpo_steps(_grpo_trainer(algo, share), steps=4))


def _sft_config(tmp_path, name: str, *more: str):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {i} " * (i % 3 + 1)},
                                                     {"role": "assistant", "content": w * (i % 2 + 1)}]}) + "\n"
                            for i, w in enumerate(["apple", "river", "stone", "cloud", "amber", "maple", "cedar", "lemon"])))
    return load_config(None, [f"name={name}", f"output_dir={tmp_path}", "model.name=tiny-llama", "algo.name=sft", f"data.path={rows}",
                              "data.packing=true", "data.max_length=64", "data.batch_size=4", "train.steps=2", "train.micro_batch=1",
                              "train.autocast=none", "train.lr=1e-3", "threads=1", "log.progress=false", "log.tensorboard=false", *more])


@pytest.mark.slow  # ~10 s on 2 loaded cores: a follower process starts twice; the fast test above checks the maths
def test_an_sft_run_split_over_two_processes_trains_and_resumes_like_one(tmp_path):
    """Ulysses over two processes, one step, then resumed for the second (the follower reads the checkpoint)."""
    from safetensors.torch import load_file

    from longhaul.runtime.offline import run_offline

    one = run_offline(_sft_config(tmp_path, "one"))
    split = ("train.context_parallel=2", "train.context_attention=ulysses")
    run_offline(_sft_config(tmp_path, "two", *split, "train.steps=1"))
    two = run_offline(_sft_config(tmp_path, "two", *split), resume=True)
    losses = [{r["step"]: r["loss"] for r in map(json.loads, (tmp_path / n / "metrics.jsonl").read_text().splitlines()) if "loss" in r}
              for n in ("one", "two")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and len(losses[0]) == 2
    assert one["heldout"]["after"] == pytest.approx(two["heldout"]["after"], rel=1e-5)
    wa, wb = (load_file(tmp_path / n / "checkpoints" / "step_2" / "model.safetensors") for n in ("one", "two"))
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    # Adam's step, lr * m / (sqrt(v) + eps), turns the rounding of a near-zero gradient into up to lr
    # (measured 3.5e-5 here, lr 1e-3); a wrong gradient moves weights by ~lr each
    assert worst < 1e-4, f"max parameter difference {worst:.3g}"


def test_bad_context_parallel_settings_get_one_line(tmp_path):
    with pytest.raises(LonghaulError, match=r"train.context_parallel"):
        load_config(None, ["train.context_parallel=0"])
    with pytest.raises(LonghaulError) as e:
        check_split(heads=4, world=3, attention="ulysses")
    assert str(e.value) == ("train.context_attention=ulysses splits the 4 query heads over train.context_parallel=3 processes, which "
                            "does not divide them; set train.context_parallel to a divisor of 4 or train.context_attention=ring")
    check_split(heads=4, world=3, attention="ring")  # ring takes any N
    from longhaul.models import load_policy

    with pytest.raises(LonghaulError, match=r"^train.context_attention=ulysses splits the 4 query heads over train.context_parallel=3 "):
        check(_sft_config(tmp_path, "y", "train.context_parallel=3", "train.context_attention=ulysses"), True, load_policy("tiny-llama")[0])
    cfg = _sft_config(tmp_path, "x", "train.context_parallel=2")
    with pytest.raises(LonghaulError, match=r"^train.context_parallel=2 splits each packed row over 2 processes; set data.packing=true$"):
        check(cfg.model_copy(update={"data": cfg.data.model_copy(update={"packing": False})}), splits=True)
    with pytest.raises(LonghaulError, match=r"^train.context_parallel=2 splits packed SFT rows, DPO answers and GRPO's \(prompt, completion\) "
                                            r"rows; algo.name=sft does not take it; set train.context_parallel=1$"):
        check(cfg, splits=False)
    with pytest.raises(LonghaulError, match=r"^runtime.trainers=2 \(data-parallel replicas\) combines with train.context_parallel "
                                            r"for algo.name=grpo only, not sft; set runtime.trainers=1$"):
        check(cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"trainers": 2})}), splits=True)
    grpo = _sft_config(tmp_path, "g", "algo.name=grpo", "train.context_parallel=2")
    check(grpo, splits=True)  # a shared prompt splits too
    unshared = grpo.model_copy(update={"train": grpo.train.model_copy(update={"share_prompt": False})})
    check(unshared, splits=True)
    with pytest.raises(LonghaulError, match=r"^algo.loss=gspo weighs each token by its whole sequence's ratio"):
        check(unshared.model_copy(update={"algo": unshared.algo.model_copy(update={"loss": "gspo"})}), splits=True)
    check(unshared.model_copy(update={"runtime": unshared.runtime.model_copy(update={"trainers": 2})}), splits=True)
    with pytest.raises(LonghaulError, match=r"^train.context_parallel=2 keeps a full replica of the model on every rank, so its "
                                            r"data-parallel replicas sum gradients like ddp, not runtime.data_parallel=fsdp2; "
                                            r"set runtime.data_parallel=ddp$"):
        check(unshared.model_copy(update={"runtime": unshared.runtime.model_copy(update={"trainers": 2, "data_parallel": "fsdp2"})}),
              splits=True)
    shared = pack_shared([5, 6, 7], [[8, 9], [10, 11, 12]], pad_id=0)  # flat rows: the prompt's 3, then 1 and 2
    assert document_ids(shared).tolist() == [0, 0, 0, 1 + SEES, 2 + SEES, 2 + SEES]  # each completion also sees document 0
    shared.q_len[0] -= 1  # the prompt's first row is no longer queried: what the completions see is not a whole sequence
    with pytest.raises(LonghaulError, match=r"^context parallel splits rows that attend to their own sequence and at most one whole "
                                            r"sequence before it \(a shared prompt\); this packed layout is neither$"):
        document_ids(shared)


@pytest.mark.slow  # a follower process starts: ~10 s on 2 loaded cores
def test_a_dpo_run_split_over_two_processes_trains_like_one(tmp_path):
    from longhaul.runtime.offline import run_offline

    rows = tmp_path / "pairs.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"name a colour {i}", "chosen": c, "rejected": r}) + "\n"
                            for i, (c, r) in enumerate([("red", "seven"), ("blue", "chair"), ("green", "runs"), ("amber", "nine"),
                                                        ("teal", "table"), ("violet", "jumps")])))

    def run(name: str, *more: str) -> list[float]:
        cfg = load_config(None, [f"name={name}", f"output_dir={tmp_path}", "model.name=tiny-llama", "algo.name=dpo", f"data.path={rows}",
                                 "data.packing=true", "data.max_length=64", "data.batch_size=4", "train.steps=2", "train.micro_batch=2",
                                 "train.autocast=none", "train.lr=1e-3", "threads=1", "log.progress=false", "log.tensorboard=false", *more])
        run_offline(cfg)
        return [r["loss"] for r in map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines()) if "loss" in r]

    one, two = run("one"), run("two", "train.context_parallel=2")
    assert len(one) == 2 and one == pytest.approx(two, rel=1e-5)
