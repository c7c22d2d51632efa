"""Offline training runs: SFT, reward models, DPO and distillation on teacher logits.

One loop for all four: read and encode the dataset (`data.path`), hold out a seeded fraction,
evaluate the held-out rows before training, take `train.steps` optimizer steps of
`data.batch_size` rows (reshuffled every epoch, seeded, so the data order is a pure function of
the step), checkpoint atomically with the data position, evaluate again, write the report.
Each algorithm is an `OfflineAlgo` that `runtime.algorithms` names: how a row is encoded and how
its trainer is built; the trainers share `step(rows)`, `evaluate(rows)`, `state_dict()`, `load_state_dict()`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
import transformers

from longhaul.config import RunConfig, dump_config
from longhaul.errors import LonghaulError
from longhaul.eval.report import write_report
from longhaul.hardware import resolve_device
from longhaul.inference.threads import SectionThreads
from longhaul.malloc import between_steps
from longhaul.models import load_frozen, load_policy
from longhaul.models.lora import apply_lora
from longhaul.rl.checkpoint import (
    load_trainer_state,
    load_weights,
    save_checkpoint,
    set_rng_state,
)
from longhaul.rl.data import encode_pair_row, encode_sft_row, load_rows, truncate
from longhaul.rl.distill import DistillTrainer
from longhaul.rl.dpo import DPOTrainer
from longhaul.rl.reward_model import RewardModel, RewardTrainer, load_head, save_head
from longhaul.rl.sft import SFTTrainer
from longhaul.runtime.algorithms import builder
from longhaul.runtime.context_trainers import ContextParallelTrainer
from longhaul.runtime.context_trainers import check as check_context_parallel
from longhaul.runtime.memory import measure
from longhaul.runtime.metrics import MetricsLog, read_metrics
from longhaul.runtime.notice import StopNotice
from longhaul.runtime.progress import console, progress_bar
from longhaul.runtime.setup import open_run_dir


@dataclass
class Built:
    trainer: object  # step(rows) / evaluate(rows) / state_dict() / load_state_dict()
    model: object  # what a checkpoint saves with save_pretrained (the LM, or the reward model's backbone LM)
    save_extra: Callable | None = None  # writes extra files into a checkpoint directory (the reward head)
    load_extra: Callable | None = None  # reads them back on resume


@dataclass
class OfflineAlgo:
    encode: Callable  # (tok, row, cfg) -> one training item
    build: Callable  # (cfg, policy, tok, items) -> Built
    has_loss_tokens: Callable = lambda item: True
    curves: tuple = (("loss", "train loss"), ("grad_norm", "gradient norm"), ("lr", "learning rate"))
    context_parallel: bool = False  # its trainer splits packed rows over train.context_parallel processes


@dataclass(frozen=True)
class TooLong:
    """A multi-turn row over data.max_length: skipped whole, and counted."""
    tokens: int


def _encode_sft(tok, row, cfg):
    ids, mask = encode_sft_row(tok, row)
    if len(ids) > cfg.data.max_length and sum(m.get("role") == "assistant" for m in row.get("messages", ())) > 1:
        return TooLong(len(ids))  # a multi-turn episode cut short would teach a truncated episode: skipped whole
    return truncate((ids, mask), cfg.data.max_length)


def _encode_pair(tok, row, cfg):
    chosen, rejected = encode_pair_row(tok, row)
    return truncate(chosen, cfg.data.max_length), truncate(rejected, cfg.data.max_length)


def _build_sft(cfg, policy, tok, items):

    if cfg.train.context_parallel > 1:
        return Built(ContextParallelTrainer(cfg, policy, tok), policy)
    return Built(SFTTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.data.packing,
                             cfg.data.pack_length or cfg.data.max_length), policy)


def _build_rm(cfg, policy, tok, items):

    rm = RewardModel(policy, tok.pad_token_id)
    return Built(RewardTrainer(rm, cfg.algo, cfg.train), policy, lambda path: save_head(rm, path), lambda path: load_head(rm, path))


def _build_dpo(cfg, policy, tok, items):

    if cfg.train.context_parallel > 1:
        return Built(ContextParallelTrainer(cfg, policy, tok, items), policy)
    return Built(DPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, items), policy)


def _build_distill(cfg, policy, tok, items):

    teacher = load_frozen(cfg.algo.teacher, tok)
    return Built(DistillTrainer(policy, teacher, tok.pad_token_id, cfg.algo, cfg.train, vocab_size=len(tok)), policy)


_sft_tokens = lambda item: sum(item[1][1:]) > 0
SFT = OfflineAlgo(_encode_sft, _build_sft, _sft_tokens,
                             (("loss", "train loss"), ("heldout/loss", "held-out loss"), ("grad_norm", "gradient norm"), ("lr", "learning rate")),
                             context_parallel=True)
RM = OfflineAlgo(lambda tok, row, cfg: tuple(ids for ids, _ in _encode_pair(tok, row, cfg)), _build_rm, lambda item: True,
                            (("loss", "train loss"), ("accuracy", "train accuracy"), ("heldout/accuracy", "held-out accuracy"),
                             ("margin", "reward margin")))
DPO = OfflineAlgo(_encode_pair, _build_dpo, lambda item: sum(item[0][1][1:]) > 0 and sum(item[1][1][1:]) > 0,
                             (("loss", "train loss"), ("rewards/accuracies", "train preference accuracy"),
                              ("heldout/accuracy", "held-out preference accuracy"), ("rewards/margins", "reward margin")),
                             context_parallel=True)
DISTILL = OfflineAlgo(_encode_sft, _build_distill, _sft_tokens,
                                 (("loss", "train divergence"), ("heldout/divergence", "held-out divergence"), ("grad_norm", "gradient norm")))


def encode_dataset(cfg: RunConfig, tok, spec: OfflineAlgo) -> list:
    if not cfg.data.path:
        raise LonghaulError(f"algo.name={cfg.algo.name} trains on a dataset; set data.path to a .jsonl/.json/.parquet file or a save_to_disk directory")
    items, empty, long = [], 0, []
    for n, row in enumerate(load_rows(cfg.data.path, cfg.data.split), 1):
        try:
            item = spec.encode(tok, row, cfg)
        except LonghaulError as e:
            raise LonghaulError(f"dataset {cfg.data.path!r} row {n}: {e}") from e
        if isinstance(item, TooLong):
            long.append(item.tokens)
        elif spec.has_loss_tokens(item):
            items.append(item)
        else:
            empty += 1
    if long and not items:
        raise LonghaulError(f"every multi-turn row of {cfg.data.path!r} is longer than data.max_length={cfg.data.max_length} tokens "
                            f"(the shortest has {min(long)}); raise data.max_length and model.context_length to at least {min(long)}")
    if long:
        console.print(f"[yellow]note:[/] {len(long)} multi-turn rows are longer than data.max_length={cfg.data.max_length} "
                      f"tokens (up to {max(long)}) and are skipped whole")
    if empty:
        console.print(f"[yellow]note:[/] {empty} rows have no trainable tokens within data.max_length={cfg.data.max_length} and are skipped")
    if len(items) < 2:
        raise LonghaulError(f"dataset {cfg.data.path!r} has {len(items)} usable rows; it needs at least 2")
    return items


def split_heldout(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """A seeded, fixed held-out fraction (at least one row when the fraction is > 0)."""
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    n_held = min(len(items) - 1, max(1, round(fraction * len(items)))) if fraction > 0 else 0
    held = sorted(order[:n_held])
    keep = sorted(order[n_held:])
    return [items[i] for i in keep], [items[i] for i in held]


def batch_indices(step: int, batch: int, n: int, seed: int, shuffle: bool) -> list[int]:
    """Rows of (1-based) `step`: positions (step-1)*batch .. step*batch-1 of an endless sequence of
    epochs, each a fresh seeded permutation. A pure function of the step, so resume is exact."""
    out = []
    for pos in range((step - 1) * batch, step * batch):
        epoch, k = divmod(pos, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch)) if shuffle else torch.arange(n)
        out.append(int(perm[k]))
    return out


def run_offline(cfg: RunConfig, resume: bool = False) -> dict:

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(cfg.seed)
    spec = builder(cfg.algo.name, "offline")
    policy, tok = load_policy(cfg.model.name, cfg.model.rope_scaling, resolve_device(cfg.train.device))
    check_context_parallel(cfg, spec.context_parallel, policy)
    items = encode_dataset(cfg, tok, spec)
    train_items, heldout = split_heldout(items, cfg.data.heldout_fraction if cfg.eval.before_after else 0.0, cfg.seed)
    run_dir, ckpt = open_run_dir(cfg, resume)
    console.rule(f"longhaul train ({cfg.algo.name}): {cfg.name}")
    console.print(dump_config(cfg), end="")
    console.print(f"{len(train_items)} training rows, {len(heldout)} held out")
    t = cfg.train
    if t.lora_r:
        policy = apply_lora(policy, t.lora_r, t.lora_alpha, t.lora_dropout, t.lora_targets, cfg.model.name)
    built = spec.build(cfg, policy, tok, train_items + heldout)  # before resuming: DPO scores its reference here
    try:
        before = _train(cfg, spec, built, tok, (train_items, heldout), run_dir, ckpt, resume)
    finally:
        close = getattr(built.trainer, "close", None)  # a context-parallel trainer's processes
        if close is not None:
            close()
    return _finish(cfg, spec, run_dir, heldout, before)


def _train(cfg: RunConfig, spec: OfflineAlgo, built: Built, tok, data: tuple[list, list], run_dir, ckpt, resume: bool):
    """Resume from `ckpt` if given, evaluate, take the steps, checkpoint; the held-out metrics before training."""
    (train_items, heldout), t = data, cfg.train
    trainer = built.trainer
    start = 0
    if ckpt is not None:
        load_weights(built.model, ckpt)
        if built.load_extra is not None:
            built.load_extra(ckpt)
        state = load_trainer_state(ckpt)
        trainer.load_state_dict(state)
        set_rng_state(state["rng"])
        start = state["step"]
        console.print(f"resuming from {ckpt} (step {start})")
    log = MetricsLog(run_dir, cfg, resume_step=start if resume else None)
    before = None
    if heldout and start == 0:
        before = trainer.evaluate(heldout)
        log.write(0, before)
    B = cfg.data.batch_size
    if cfg.log.progress:
        console.print(measure(built.model, trainer).table())
    threads = SectionThreads()  # a step's threads, from what neighbours used during the last one
    with progress_bar(cfg.log.progress) as prog, StopNotice() as notice:
        bar = prog.add_task(f"train {cfg.algo.name}", total=t.steps, completed=start, info="")
        for step in range(start + 1, t.steps + 1):
            t0 = time.perf_counter()
            rows = [train_items[i] for i in batch_indices(step, B, len(train_items), cfg.seed, cfg.data.shuffle)]
            with threads:
                m = trainer.step(rows)
            if not math.isfinite(m.get("loss", 0.0)):
                raise LonghaulError(f"step {step} produced a non-finite loss; the last checkpoint is intact; lower train.lr, then --resume")
            m["step_time"] = time.perf_counter() - t0
            m["epoch"] = step * B / len(train_items)
            m.update(between_steps())
            m.update(measure(built.model, trainer).metrics())
            last = step == t.steps
            if heldout and (last or (t.save_every and step % t.save_every == 0)):
                m.update(trainer.evaluate(heldout))
            log.write(step, m)
            info = "  ".join(f"{k} {v:.4g}" for k, v in m.items() if k in ("loss", "accuracy", "rewards/accuracies", "heldout/loss",
                                                                              "heldout/accuracy", "heldout/divergence"))
            prog.update(bar, advance=1, info=info)
            if notice.checkpoint_due(step, t.steps, t.save_every):
                saved = save_checkpoint(run_dir / "checkpoints", step, built.model, tok,
                                        {**trainer.state_dict(), "data_position": step * B}, t.keep_last, extra=built.save_extra)
                notice.end_if_told(step, t.steps, saved, log)
    log.close()
    return before


def _finish(cfg: RunConfig, spec: OfflineAlgo, run_dir, heldout: list, before) -> dict:
    """The run's result and report, from its metrics."""
    metrics = read_metrics(run_dir)
    t = cfg.train
    result = {"run_dir": str(run_dir), "steps": t.steps}
    if heldout:
        first = next((r for r in metrics if r["step"] == 0), before)
        final = next((r for r in reversed(metrics) if any(k.startswith("heldout/") for k in r)), None)
        result["heldout"] = {"before": {k: v for k, v in (first or {}).items() if k.startswith("heldout/")},
                             "after": {k: v for k, v in (final or {}).items() if k.startswith("heldout/")}}
        _print_heldout(result["heldout"])
    report = write_report(run_dir, metrics, None, f"longhaul run {cfg.name} ({cfg.algo.name})", curves=spec.curves)
    console.print(f"report: {report}")
    return result


def _print_heldout(h: dict) -> None:
    from rich.table import Table

    table = Table(title="held-out rows, before and after training")
    for col in ("metric", "before", "after"):
        table.add_column(col)
    for k in h["after"]:
        b = h["before"].get(k)
        table.add_row(k, "-" if b is None else f"{b:.4f}", f"{h['after'][k]:.4f}")
    console.print(table)
