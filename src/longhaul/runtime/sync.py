"""The synchronous, on-policy RL run (GRPO, PPO, on-policy distillation): evaluate the base policy, train, evaluate again, report.

One process: sample groups with a (bf16) copy of the policy, score them with the task
family's verifier, take one GRPO step, copy the new weights into the sampler, log,
checkpoint. Everything that can be wrong with the input is checked before `runs/<name>/`
is created.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from longhaul.agent.rollout import rollout_groups
from longhaul.agent.single_turn import encode_prompt
from longhaul.config import RunConfig, dump_config
from longhaul.envs import get_family
from longhaul.envs.registry import reward_family
from longhaul.errors import LonghaulError
from longhaul.eval.envcheck import require_checked
from longhaul.eval.passrate import EvalResult, compare, evaluate
from longhaul.eval.report import write_report
from longhaul.inference import LLMEngine, SamplingParams, make_engine, sync_weights
from longhaul.models import load_frozen, load_policy
from longhaul.models.lora import apply_lora
from longhaul.rl.checkpoint import list_checkpoints, load_trainer_state, load_weights, save_checkpoint, set_rng_state
from longhaul.rl.grpo import GRPOTrainer, frozen_copy
from longhaul.rl.registry import Registry
from longhaul.runtime.metrics import MetricsLog, read_metrics
from longhaul.runtime.progress import console, progress_bar


def _grpo(cfg: RunConfig, policy, tok):
    return GRPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature, cfg.rollout.max_new_tokens)


def _ppo(cfg: RunConfig, policy, tok):
    from longhaul.rl.ppo import PPOTrainer

    return PPOTrainer(policy, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature, cfg.rollout.max_new_tokens)


def _onpolicy_distill(cfg: RunConfig, policy, tok):
    from longhaul.rl.distill import OnPolicyDistillTrainer

    teacher = load_frozen(cfg.algo.teacher, tok)
    return OnPolicyDistillTrainer(policy, teacher, tok.pad_token_id, cfg.algo, cfg.train, cfg.rollout.temperature,
                                  cfg.rollout.max_new_tokens, cfg.algo.distill_reward_weight, vocab_size=len(tok))


ONLINE = Registry("online algorithm")  # algorithms that learn from their own rollouts: name -> trainer factory
ONLINE.update(grpo=_grpo, ppo=_ppo, onpolicy_distill=_onpolicy_distill)


@dataclass
class Prepared:
    cfg: RunConfig
    family: object
    policy: object
    tok: object
    train_tasks: list
    heldout: list


def prepare(cfg: RunConfig, training: bool = True) -> Prepared:
    """Load and validate everything; touches nothing on disk except the model cache."""
    family = get_family(cfg.task.family)
    excluded = require_checked(family) if cfg.task.require_envcheck and training else set()
    if cfg.task.reward:
        family = reward_family(family, cfg.task.reward)
    if cfg.task.reward_model:
        from longhaul.rl.reward_model import reward_model_family

        family = reward_model_family(family, cfg.task.reward_model)
    n_train = cfg.train.steps * cfg.rollout.prompts_per_step * (1 + (cfg.algo.max_refill_rounds if cfg.algo.dynamic_sampling else 0))  # refills draw extra tasks
    try:
        train_tasks = _usable(family, "train", n_train, cfg, excluded) if n_train else []
        heldout = _usable(family, "heldout", cfg.eval.n_tasks, cfg, excluded) if cfg.eval.before_after else []
    except ValueError as e:
        raise LonghaulError(f"task config: {e}") from e
    policy, tok = load_policy(cfg.model.name)
    context = cfg.model.context_length or policy.config.max_position_embeddings
    budget = max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens if heldout else 0)
    longest = max(train_tasks + heldout, key=lambda t: len(t.prompt))
    if family.kind == "answer":
        n_prompt = len(encode_prompt(tok, longest.prompt))
    else:
        from longhaul.envs.workspace import WorkspaceEnv

        text = tok.apply_chat_template(WorkspaceEnv.initial_messages(longest), tokenize=False, add_generation_prompt=True)
        n_prompt = len(tok(text, add_special_tokens=False).input_ids)
    if n_prompt + budget > context:
        raise LonghaulError(
            f"prompt of task {longest.task_id} is {n_prompt} tokens and {budget} new tokens are asked, over the model context "
            f"of {context}; lower rollout.max_new_tokens / eval.max_new_tokens or raise model.context_length"
        )
    return Prepared(cfg, family, policy, tok, train_tasks, heldout)


def _make_sampler(cfg: RunConfig, policy, tok):
    """What rollouts sample from: the paged engine holding a copy of the policy's weights in
    rollout.dtype (the default), or for rollout.sampler=hf the HF model (a bf16 copy)."""
    if cfg.rollout.sampler == "engine":
        return make_engine(policy, tok, cfg.rollout.dtype, max_model_len=cfg.model.context_length)
    return frozen_copy(policy, torch.bfloat16) if cfg.rollout.dtype == "bfloat16" else policy


def _usable(family, split: str, n: int, cfg: RunConfig, excluded: set[str]) -> list:
    """`n` tasks of a split, skipping those envcheck found flaky or failing."""
    tasks = family.make_split(split, n + len(excluded), cfg.task.difficulty, cfg.task.subfamilies)
    return [t for t in tasks if t.task_id not in excluded][:n]


def _open_run_dir(cfg: RunConfig, resume: bool) -> tuple[Path, Path | None]:
    run_dir = cfg.run_dir
    ckpt = list_checkpoints(run_dir / "checkpoints")[-1] if resume and list_checkpoints(run_dir / "checkpoints") else None
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise LonghaulError(f"run directory {str(run_dir)!r} already exists; pass --resume to continue it or set name=... for a new run")
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(dump_config(cfg))
    os.replace(tmp, run_dir / "config.yaml")
    return run_dir, ckpt


def evaluate_heldout(prep: Prepared, make_model, label: str, path: Path, samples: int = 1, temperature: float = 0.8) -> EvalResult:
    if path.exists():
        return EvalResult.load(path)
    model = make_model()
    cfg = prep.cfg
    with progress_bar(cfg.log.progress) as prog:
        bar = prog.add_task(f"eval {label}", total=len(prep.heldout), info="")
        res = evaluate(model, prep.tok, prep.family, prep.heldout, label, cfg.eval.max_new_tokens, cfg.eval.batch_size,
                       cfg.rollout.exec_timeout_s, cfg.rollout.exec_workers, on_batch=lambda n: prog.advance(bar, n),
                       samples=samples, temperature=temperature, seed=cfg.seed, max_turns=cfg.eval.max_turns)
    res.save(path)
    lo, hi = res.interval
    if cfg.log.progress:
        console.print(f"[bold]{label}[/]: held-out pass rate {100 * res.rate:.1f}% ({sum(res.passed)}/{len(res.passed)}, 95% [{100 * lo:.1f}, {100 * hi:.1f}])")
    return res


def _collect(cfg: RunConfig, prep: Prepared, sampler, params, step: int, cursor: int):
    """This step's groups from the next prompts_per_step tasks. With algo.dynamic_sampling
    (DAPO), groups whose rewards are all equal carry no gradient: they are replaced by groups of
    further tasks, for up to algo.max_refill_rounds extra rounds. Returns (groups, timings, cursor)."""
    P = cfg.rollout.prompts_per_step

    def roll(tasks, round_):
        return rollout_groups(sampler, prep.tok, prep.family, tasks, cfg.rollout.group_size, params,
                              seed=cfg.seed * 1_000_003 + step + 7919 * round_, version=step - 1, max_turns=cfg.rollout.max_turns,
                              max_tokens=cfg.model.context_length, exec_timeout_s=cfg.rollout.exec_timeout_s,
                              exec_workers=cfg.rollout.exec_workers)

    groups, gen = roll(prep.train_tasks[cursor:cursor + P], 0)
    cursor += P
    if not cfg.algo.dynamic_sampling:
        return groups, gen, cursor
    varied = lambda gs: [g for g in gs if len({t.reward for t in g}) > 1]
    kept, sampled, rounds = varied(groups), len(groups), 0
    while len(kept) < P and rounds < cfg.algo.max_refill_rounds and cursor < len(prep.train_tasks):
        rounds += 1
        more = prep.train_tasks[cursor:cursor + P - len(kept)]
        cursor += len(more)
        extra, g2 = roll(more, rounds)
        gen = {k: gen[k] + g2[k] for k in gen}
        kept += varied(extra)
        sampled += len(extra)
    gen.update({"dynamic_sampling/groups_sampled": sampled, "dynamic_sampling/refill_rounds": rounds})
    return (kept[:P] or groups), gen, cursor


def _step_metrics(groups, gen: dict, m: dict, step_time: float) -> dict:
    trajs = [t for g in groups for t in g]
    lens = [t.completion_len for t in trajs]
    return {
        **m,
        "pass_rate": sum(t.info["passed"] for t in trajs) / len(trajs),
        "completions/mean_length": sum(lens) / len(lens),
        "completions/min_length": min(lens),
        "completions/max_length": max(lens),
        "completions/clipped_ratio": sum(bool(t.turns) and t.turns[-1].finish_reason == "length" for t in trajs) / len(trajs),
        **{k: v for k, v in gen.items() if k.startswith("dynamic_sampling/")},
        "timing/gen": gen["timing/gen"],
        "timing/score": gen["timing/score"],
        "step_time": step_time,
        "tokens_per_s": (gen["gen_tokens"] + m["num_tokens"]) / step_time,
    }


def run_training(cfg: RunConfig, resume: bool = False) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(cfg.seed)
    prep = prepare(cfg)
    run_dir, ckpt = _open_run_dir(cfg, resume)
    console.rule(f"longhaul train: {cfg.name}")
    console.print(dump_config(cfg), end="")
    policy, tok, family = prep.policy, prep.tok, prep.family
    t = cfg.train
    if t.lora_r:
        policy = apply_lora(policy, t.lora_r, t.lora_alpha, t.lora_dropout, t.lora_targets, cfg.model.name)
    trainer = ONLINE.get_fn(cfg.algo.name)(cfg, policy, tok)
    start = cursor = 0  # cursor: train tasks consumed so far (the data position)
    if ckpt is not None:
        load_weights(policy, ckpt)
        state = load_trainer_state(ckpt)
        trainer.load_state_dict(state)
        set_rng_state(state["rng"])
        start = state["step"]
        cursor = state.get("data_position", start * cfg.rollout.prompts_per_step)
        console.print(f"resuming from {ckpt} (step {start})")
    sampler = _make_sampler(cfg, policy, tok)
    log = MetricsLog(run_dir, cfg.log.tensorboard, resume_step=start if resume else None)
    if start < cfg.train.steps:  # results of an earlier, shorter run describe other weights
        (run_dir / "eval_trained.json").unlink(missing_ok=True)
    base = None
    if cfg.eval.before_after:
        # a resumed run normally finds the base result on disk; if not, the base weights are reloaded
        base_model = (lambda: sampler) if ckpt is None else (lambda: _make_sampler(cfg, load_policy(cfg.model.name)[0], tok))
        base = evaluate_heldout(prep, base_model, "base", run_dir / "eval_base.json")
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p, stop=family.stop, batch_size=64)
    with progress_bar(cfg.log.progress) as prog:
        bar = prog.add_task("train", total=cfg.train.steps, completed=start, info="")
        for step in range(start + 1, cfg.train.steps + 1):
            t0 = time.perf_counter()
            groups, gen, cursor = _collect(cfg, prep, sampler, params, step, cursor)
            m = trainer.step(groups)
            if isinstance(sampler, LLMEngine):
                sync_weights(sampler, policy, version=step)
            elif sampler is not policy:
                sampler.load_state_dict(policy.state_dict())
            metrics = _step_metrics(groups, gen, m, time.perf_counter() - t0)
            log.write(step, metrics)
            kl_key = "distill/reverse_kl" if "distill/reverse_kl" in metrics else "kl"
            info = (f"reward {metrics['reward']:.3f} pass {metrics['pass_rate']:.2f} {kl_key} {metrics[kl_key]:.4f} "
                    f"len {metrics['completions/mean_length']:.0f} {metrics['tokens_per_s']:.0f} tok/s {metrics['step_time']:.1f}s/step")
            prog.console.print(f"step {step}/{cfg.train.steps}  {info}")
            for warning in _stability_warnings(metrics, cfg):
                prog.console.print(f"[yellow]warning:[/] {warning}")
            prog.update(bar, advance=1, info=info)
            if step == cfg.train.steps or (cfg.train.save_every and step % cfg.train.save_every == 0):
                save_checkpoint(run_dir / "checkpoints", step, policy, tok,
                                {**trainer.state_dict(), "data_position": cursor}, cfg.train.keep_last)
    log.close()
    result = {"run_dir": str(run_dir), "steps": cfg.train.steps}
    comparison = None
    if base is not None:
        trained = evaluate_heldout(prep, lambda: sampler, "trained", run_dir / "eval_trained.json")
        comparison = compare(base, trained)
        _print_comparison(comparison)
        result["comparison"] = comparison
    report = write_report(run_dir, read_metrics(run_dir), comparison, f"longhaul run {cfg.name}")
    console.print(f"report: {report}")
    return result


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
