"""An online RL run (GRPO, PPO, on-policy distillation): evaluate the base policy, train, evaluate again, report.

`run_training` sets the run up (config checks, run directory, trainer, resume) and hands the
loop to `runtime.controller.Controller`: synchronous by default (sample with a copy of the
policy, score, one trainer step, copy the new weights back), or asynchronous with rollout
workers running ahead by at most `runtime.max_staleness` versions. Everything that can be
wrong with the input is checked before `runs/<name>/` is created.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import transformers

from longhaul.config import RunConfig, dump_config
from longhaul.eval.agent_metrics import agent_metrics
from longhaul.eval.passrate import compare
from longhaul.eval.report import write_report
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
from longhaul.rl.distill import OnPolicyDistillTrainer
from longhaul.rl.grpo import GRPOTrainer
from longhaul.rl.ppo import PPOTrainer
from longhaul.runtime.algorithms import builder
from longhaul.runtime.buffer import ReplayBuffer
from longhaul.runtime.context_trainers import ContextParallelTrainer
from longhaul.runtime.controller import Controller, buffer_capacity, make_rollouts
from longhaul.runtime.memory import measure
from longhaul.runtime.metrics import MetricsLog, read_metrics
from longhaul.runtime.notice import StopNotice
from longhaul.runtime.progress import console, progress_bar
from longhaul.runtime.rollout import make_sampler
from longhaul.runtime.setup import evaluate_heldout, open_run_dir, prepare
from longhaul.runtime.tasks import ScheduledTasks, TaskStream
from longhaul.runtime.trainers import ShardedTrainer
from longhaul.sandbox.audit import audit_to


def grpo_trainer(cfg: RunConfig, policy, tok):
    return GRPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature, cfg.rollout.max_new_tokens)


def ppo_trainer(cfg: RunConfig, policy, tok):

    return PPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature, cfg.rollout.max_new_tokens)


def onpolicy_distill_trainer(cfg: RunConfig, policy, tok):

    teacher = load_frozen(cfg.algo.teacher, tok)
    return OnPolicyDistillTrainer(policy, teacher, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature,
                                  cfg.rollout.max_new_tokens, cfg.algo.distill_reward_weight, vocab_size=len(tok))


def online_builder(name: str):
    """The trainer factory of the online algorithm `name` (runtime.algorithms)."""
    return builder(name, "online")


def _step_metrics(groups, gen: dict, m: dict, step_time: float) -> dict:
    """The step's metrics; rates describe the sampled episodes (not the demonstrations guidance put in)."""
    trajs = [t for g in groups for t in g if not t.info.get("guided")]
    guided = sum(len(g) for g in groups) - len(trajs)
    lens = [t.completion_len for t in trajs]
    if guided:
        m = {**m, "reward": sum(t.reward for t in trajs) / len(trajs), "guidance/demos": guided}
    return {
        **m,
        "pass_rate": sum(t.info["passed"] for t in trajs) / len(trajs),
        "completions/mean_length": sum(lens) / len(lens),
        "completions/min_length": min(lens),
        "completions/max_length": max(lens),
        "completions/clipped_ratio": sum(bool(t.turns) and t.turns[-1].finish_reason == "length" for t in trajs) / len(trajs),
        **{k: v for k, v in gen.items() if k.startswith(("dynamic_sampling/", "staleness/", "rollout/", "timing/wait"))},
        "timing/gen": gen["timing/gen"],
        "timing/score": gen["timing/score"],
        "gen_tokens": gen["gen_tokens"],
        "step_time": step_time,
        "tokens_per_s": (gen["gen_tokens"] + m["num_tokens"]) / step_time,
        **{f"agent/{k}": v for k, v in agent_metrics(trajs).items() if v is not None and k != "pass_rate"},
    }


def run_training(cfg: RunConfig, resume: bool = False) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(cfg.seed)
    prep = prepare(cfg)
    run_dir, ckpt = open_run_dir(cfg, resume)
    with audit_to(run_dir / "audit.jsonl" if cfg.log.audit else None):  # every sandbox of the run, its workers' too
        return _run_training(cfg, resume, prep, run_dir, ckpt)


def _run_training(cfg: RunConfig, resume: bool, prep, run_dir: Path, ckpt) -> dict:
    console.rule(f"longhaul train: {cfg.name}")
    console.print(dump_config(cfg), end="")
    policy, tok, family = prep.policy, prep.tok, prep.family
    t = cfg.train
    if t.lora_r:
        policy = apply_lora(policy, t.lora_r, t.lora_alpha, t.lora_dropout, t.lora_targets, cfg.model.name)
    if cfg.train.context_parallel > 1:  # rows split over ranks (of each data-parallel replica) in child processes; this is rank 0
        trainer = ContextParallelTrainer(cfg, policy, tok)
    elif cfg.runtime.trainers > 1:  # data-parallel ranks in child processes; this one is rank 0
        trainer = ShardedTrainer(cfg, policy, tok, ckpt)
    else:
        trainer = online_builder(cfg.algo.name)(cfg, policy, tok)
    source = ScheduledTasks(prep.scheduler) if prep.scheduler is not None else TaskStream(prep.train_tasks)
    start, state = 0, None
    if ckpt is not None:
        load_weights(policy, ckpt)
        state = load_trainer_state(ckpt)
        trainer.load_state_dict(state)
        set_rng_state(state["rng"])
        start = state["step"]
        # checkpoints written before the runtime kept its own state hold only the data position
        state.setdefault("tasks", {"cursor": state.get("data_position", start * cfg.rollout.prompts_per_step)})
        state.setdefault("submitted", 0)
        state.setdefault("ingested", [])
        source.load_state_dict(state["tasks"])
        console.print(f"resuming from {ckpt} (step {start})")
    log = MetricsLog(run_dir, cfg, resume_step=start if resume else None)
    if start < cfg.train.steps:  # results of an earlier, shorter run describe other weights
        (run_dir / "eval_trained.json").unlink(missing_ok=True)
    if state is None:  # no checkpoint to continue from: the run starts over, and so do its replay and audit logs
        (run_dir / "buffer.jsonl").unlink(missing_ok=True)
        (run_dir / "audit.jsonl").unlink(missing_ok=True)
    buffer = ReplayBuffer.open(run_dir / "buffer.jsonl", buffer_capacity(cfg), cfg.runtime.buffer_order,
                               resume_step=start if state is not None else None)
    rollouts = make_rollouts(cfg, family, tok, policy, run_dir)
    ctl = Controller(cfg, source, trainer, rollouts, buffer, policy, epoch=state.get("epoch", 0) + 1 if state else 0)
    try:  # from here on the workers, the buffer and the trainer's ranks are closed whatever happens
        rollouts.start()  # worker processes and actors load the model while this process evaluates the base weights
        t_rollouts = time.perf_counter()
        base = _evaluate_base(cfg, prep, rollouts, policy, tok, ckpt, run_dir)
        t_train = time.perf_counter()
        t_head = t_train - t_rollouts
        ctl.start(start, resume=state)
        _print_memory(policy, trainer, getattr(rollouts, "sampler", None), cfg)
        with StopNotice() as notice:
            _train_steps(cfg, ctl, trainer, policy, tok, run_dir, log, start, notice)
    finally:
        ctl.close()
        torch.set_num_threads(ctl.full_threads)
        if hasattr(trainer, "close"):
            trainer.close()
    t_train = time.perf_counter() - t_train
    log.close()
    # the loop, with whatever of the workers' start-up the set-up before it (the base evaluation) did not cover
    result = {"run_dir": str(run_dir), "steps": cfg.train.steps, "train_wall_s": t_train, "workers_head_start_s": t_head}
    comparison = None
    if base is not None:
        trained = evaluate_heldout(prep, _eval_sampler(cfg, rollouts, policy, tok), "trained", run_dir / "eval_trained.json")
        comparison = compare(base, trained)
        _print_comparison(comparison)
        result["comparison"] = comparison
    report = write_report(run_dir, read_metrics(run_dir), comparison, f"longhaul run {cfg.name}")
    console.print(f"report: {report}")
    return result


def _eval_sampler(cfg: RunConfig, rollouts, policy, tok):
    """What evaluation samples with, in this process: the inline worker's sampler, else one of its own."""
    return (lambda: rollouts.sampler) if hasattr(rollouts, "sampler") else (lambda: make_sampler(cfg, policy, tok))


def _evaluate_base(cfg: RunConfig, prep, rollouts, policy, tok, ckpt, run_dir: Path):
    """The base weights' held-out result (None without eval.before_after). A resumed run normally
    finds it on disk; if not, the base weights are reloaded."""
    if not cfg.eval.before_after:
        return None
    base_model = _eval_sampler(cfg, rollouts, policy, tok) if ckpt is None else (lambda: make_sampler(cfg, load_policy(cfg.model.name, cfg.model.rope_scaling)[0], tok))
    return evaluate_heldout(prep, base_model, "base", run_dir / "eval_base.json")


def _train_steps(cfg: RunConfig, ctl: Controller, trainer, policy, tok, run_dir: Path, log: MetricsLog, start: int,
                 notice: StopNotice) -> None:
    threads = SectionThreads()  # the update's threads, from what neighbours used during the last update
    with progress_bar(cfg.log.progress) as prog:
        bar = prog.add_task("train", total=cfg.train.steps, completed=start, info="")
        for step in range(start + 1, cfg.train.steps + 1):
            t0 = time.perf_counter()
            ctl.admit(cfg.train.steps)
            groups, gen = ctl.gather(step)
            torch.set_num_threads(ctl.trainer_threads())
            ctl.rollouts.training(True)
            try:
                with threads:
                    m = trainer.step(groups)
            finally:
                ctl.rollouts.training(False)
            ctl.publish(step)
            trimmed = between_steps()
            metrics = {**_step_metrics(groups, gen, m, time.perf_counter() - t0), **ctl.stats(), **ctl.source.metrics(),
                       **measure(policy, trainer, getattr(ctl.rollouts, "sampler", None)).metrics()}
            metrics.update(trimmed)
            log.write(step, metrics)
            log.write_rollouts(step, groups, tok)
            kl_key = "distill/reverse_kl" if "distill/reverse_kl" in metrics else "kl"
            info = (f"reward {metrics['reward']:.3f} pass {metrics['pass_rate']:.2f} {kl_key} {metrics[kl_key]:.4f} "
                    f"len {metrics['completions/mean_length']:.0f} {metrics['tokens_per_s']:.0f} tok/s {metrics['step_time']:.1f}s/step")
            if cfg.runtime.mode == "async":
                info += f" stale {metrics['staleness/mean']:.2f}"
            prog.console.print(f"step {step}/{cfg.train.steps}  {info}")
            for warning in _stability_warnings(metrics, cfg):
                prog.console.print(f"[yellow]warning:[/] {warning}")
            prog.update(bar, advance=1, info=info)
            if notice.checkpoint_due(step, cfg.train.steps, cfg.train.save_every):
                tasks = ctl.checkpoint_state()
                saved = save_checkpoint(run_dir / "checkpoints", step, policy, tok,
                                        {**trainer.state_dict(), **tasks, "data_position": tasks["tasks"].get("cursor")},
                                        cfg.train.keep_last)
                notice.end_if_told(step, cfg.train.steps, saved, log)


def _print_memory(policy, trainer, sampler, cfg: RunConfig) -> None:
    """This process's memory before the first step, and what the first step adds for certain."""
    if not cfg.log.progress:
        return
    trainable = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
    console.print(measure(policy, trainer, sampler).table())
    console.print(f"  the first step adds gradients {trainable / 1e9:.2f} GB and AdamW's moments {2 * trainable / 1e9:.2f} GB; "
                  "metrics.jsonl has memory/* every step" + ("" if sampler is not None else " (rollout workers' memory is theirs)"))


def _stability_warnings(m: dict, cfg: RunConfig) -> list[str]:
    out = []
    if m.get("kl", 0.0) > cfg.algo.kl_warn:
        out.append(f"KL to the reference is {m['kl']:.3f} (> algo.kl_warn {cfg.algo.kl_warn}); the policy is drifting fast: lower train.lr or raise algo.kl_coef")
    ent = m.get("entropy")
    if ent is not None and ent == ent and m.get("num_trained_seqs", 0) and ent < cfg.algo.entropy_warn:
        out.append(f"token entropy fell to {ent:.4f} (< algo.entropy_warn {cfg.algo.entropy_warn}); sampling is collapsing: raise rollout.temperature or add algo.entropy_coef")
    return out


def _print_comparison(cmp: dict) -> None:
    from rich.table import Table

    table = Table(title="held-out pass rate, greedy, same tasks")
    for col in ("policy", "passed", "pass rate", "95% interval"):
        table.add_column(col)
    for key in ("base", "trained"):
        s = cmp[key]
        table.add_row(key, f"{s['passed']}/{s['n']}", f"{100 * s['pass_rate']:.1f}%", f"[{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}]")
    console.print(table)
    t = cmp["mcnemar"]
    console.print(f"difference {100 * cmp['difference']:+.1f} points; McNemar exact p = {t['p_value']:.2g} "
                  f"(gained {t['gained']}, lost {t['lost']}): {'significant' if cmp['significant'] else 'not significant'} at 95%")
