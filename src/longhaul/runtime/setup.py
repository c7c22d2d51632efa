"""Setting a run up before anything touches disk, and the held-out evaluation every driver shares.

`prepare(cfg)` checks the config against the runtime, builds the run's families and task lists
(train and held-out, envcheck-gated; a joint run's domains and their scheduler) and loads the
policy, checking that the longest prompt and its token budget fit the model's context.
`open_run_dir` creates `runs/<name>/` (or finds the checkpoint a resumed run continues from).
`evaluate_heldout` is the greedy (or sampled) held-out pass rate over every part of a run, used
before and after training and by `longhaul eval`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from longhaul.agent.single_turn import encode_prompt
from longhaul.config import RunConfig, dump_config
from longhaul.envs import get_family
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError
from longhaul.eval.envcheck import require_checked
from longhaul.eval.passrate import EvalResult, evaluate
from longhaul.hardware import resolve_device
from longhaul.models import load_policy
from longhaul.rl.checkpoint import list_checkpoints
from longhaul.runtime.context_trainers import check as check_context_parallel
from longhaul.runtime.domains import TaskScheduler
from longhaul.runtime.families import build_family
from longhaul.runtime.progress import console, progress_bar
from longhaul.runtime.trackers import require as require_trackers


@dataclass
class Part:
    """One family a run trains and evaluates on: the run's family, or one domain of a joint run."""
    name: str | None  # the domain; None for a single-family run
    family: object
    train: list  # training tasks (a joint run's domain pool)
    heldout: list
    max_new_tokens: int


@dataclass
class Prepared:
    cfg: RunConfig
    family: object  # the (first) part's family
    policy: object
    tok: object
    train_tasks: list
    heldout: list  # every part's held-out tasks, in part order
    parts: list[Part] = field(default_factory=list)
    scheduler: object = None  # a joint run's TaskScheduler


def prepare(cfg: RunConfig, training: bool = True) -> Prepared:
    """Load and validate everything; touches nothing on disk except the model cache."""
    check_runtime(cfg)
    scheduler = None
    if cfg.domains:
        parts, scheduler = _domain_parts(cfg, training)
    else:
        excluded = require_checked(get_family(cfg.task.family)) if cfg.task.require_envcheck and training else set()
        family = build_family(cfg)
        n_train = cfg.train.steps * cfg.rollout.prompts_per_step * (1 + (cfg.algo.max_refill_rounds if cfg.algo.dynamic_sampling else 0))  # refills draw extra tasks
        try:
            train_tasks = _usable(family, "train", n_train, cfg, excluded) if n_train else []
            heldout = _usable(family, "heldout", cfg.eval.n_tasks, cfg, excluded) if cfg.eval.before_after else []
        except ValueError as e:
            raise LonghaulError(f"task config: {e}") from e
        parts = [Part(None, family, train_tasks, heldout, cfg.rollout.max_new_tokens)]
    resolve_device(cfg.rollout.device)  # a device that is not here is refused now, before the run directory exists
    policy, tok = load_policy(cfg.model.name, cfg.model.rope_scaling, resolve_device(cfg.train.device))
    context = cfg.model.context_length or policy.config.max_position_embeddings
    scaling = cfg.model.rope_scaling
    if scaling is not None and scaling["rope_type"] != "dynamic" and context > policy.config.max_position_embeddings:
        raise LonghaulError(f"model.context_length {context} is past the {policy.config.max_position_embeddings} positions that "
                            f"{scaling['rope_type']} RoPE scaling by {scaling['factor']:g} gives; raise model.rope_scaling.factor "
                            f"or lower model.context_length")
    for part in parts:
        check_context(part, tok, context, cfg.eval.max_new_tokens if part.heldout else 0)
    if training and cfg.rollout.guidance != "off":
        check_guidance(parts, cfg.rollout.guidance)
    return Prepared(cfg, parts[0].family, policy, tok, parts[0].train if not cfg.domains else [], [t for p in parts for t in p.heldout],
                    parts, scheduler)


def _domain_parts(cfg: RunConfig, training: bool) -> tuple[list[Part], object]:
    """A joint run's domains (envcheck-gated, version-pinned) as parts, and their scheduler."""
    for d in cfg.domains:
        fam = get_family(d.family)
        if d.sandbox and (fam.kind == "answer" or fam.make_env is not None):
            raise LonghaulError(f"domain {d.key!r}: a sandbox override applies to workspace families with the default env; "
                                f"{d.family!r} scores {'answers' if fam.kind == 'answer' else 'with its own env'}: drop `sandbox`")
    scheduler = TaskScheduler.from_config(cfg.domains if training else [d.model_copy(update={"require_envcheck": False}) for d in cfg.domains],
                                          cfg.scheduling, seed=cfg.seed, group_size=cfg.rollout.group_size)
    n_eval = max(1, cfg.eval.n_tasks // len(cfg.domains))
    parts = []
    for dcfg, dom in zip(cfg.domains, scheduler.domains):
        excluded = require_checked(get_family(dcfg.family)) if dcfg.require_envcheck and training else set()
        try:
            heldout = [t for t in dom.family.make_split("heldout", n_eval + len(excluded), dcfg.difficulty, dcfg.subfamilies)
                       if t.task_id not in excluded][:n_eval] if cfg.eval.before_after else []
        except ValueError as e:
            raise LonghaulError(f"domain {dom.name!r}: {e}") from e
        parts.append(Part(dom.name, dom.family, dom.tasks, heldout, dom.limits.max_new_tokens or cfg.rollout.max_new_tokens))
    return parts, scheduler


def check_context(part: Part, tok, context: int, eval_tokens: int) -> None:
    longest = max(part.train + part.heldout, key=lambda t: len(t.prompt))
    budget = max(part.max_new_tokens, eval_tokens)
    if part.family.kind == "answer":
        n_prompt = len(encode_prompt(tok, longest.prompt))
    else:
        text = tok.apply_chat_template(WorkspaceEnv.initial_messages(longest), tokenize=False, add_generation_prompt=True)
        n_prompt = len(tok(text, add_special_tokens=False).input_ids)
    if n_prompt + budget > context:
        raise LonghaulError(
            f"prompt of task {longest.task_id} is {n_prompt} tokens and {budget} new tokens are asked, over the model context "
            f"of {context}; lower rollout.max_new_tokens / eval.max_new_tokens or raise model.context_length "
            f"(`longhaul eval --context-length`)"
        )


def check_guidance(parts: list[Part], variant: str) -> None:
    """rollout.guidance replays each family's oracle: every family it applies to must have one."""
    multi = [p for p in parts if p.family.kind == "workspace"]
    if not multi:
        raise LonghaulError(f"rollout.guidance={variant} puts oracle episodes into multi-turn groups, and this run has no "
                            "workspace family; set rollout.guidance=off")
    for p in multi:
        if p.train and not any(getattr(t, "reference", None) for t in p.train):
            raise LonghaulError(f"rollout.guidance={variant}: family {p.family.name!r} has no oracle (its tasks carry no "
                                "reference tool calls, WorkspaceTask.reference); set rollout.guidance=off")


def check_runtime(cfg: RunConfig) -> None:
    rt = cfg.runtime
    need = (rt.max_staleness + 1 if rt.mode == "async" else 1) * cfg.rollout.prompts_per_step
    if rt.buffer_capacity and rt.buffer_capacity < need:
        raise LonghaulError(f"runtime.buffer_capacity={rt.buffer_capacity} cannot hold the {need} groups that max_staleness "
                            f"{rt.max_staleness} keeps in flight; raise it to >= {need} or set 0 (automatic)")
    check_context_parallel(cfg, splits=cfg.algo.name == "grpo")  # of the online trainers, GRPO splits its rows
    if rt.trainers > 1 and cfg.algo.name != "grpo":
        raise LonghaulError(f"runtime.trainers={rt.trainers} (data-parallel training) supports algo.name=grpo only; set runtime.trainers=1")
    if rt.sandbox_pools and (rt.backend != "ray" or rt.mode != "async"):
        raise LonghaulError(f"runtime.sandbox_pools={rt.sandbox_pools} needs runtime.backend=ray and runtime.mode=async (pools are "
                            f"Ray actors beside the rollout actors); set runtime.sandbox_pools=0 to score inside the rollout workers")
    if cfg.rollout.guidance != "off" and cfg.algo.name != "grpo":
        raise LonghaulError(f"rollout.guidance={cfg.rollout.guidance} (oracle demonstrations in failed groups) works with "
                            f"algo.name=grpo only, not {cfg.algo.name}; set rollout.guidance=off")
    if rt.mode == "async" and cfg.rollout.sampler != "engine":
        raise LonghaulError("runtime.mode=async needs rollout.sampler=engine (weights are swapped while generation runs)")


def _usable(family, split: str, n: int, cfg: RunConfig, excluded: set[str]) -> list:
    """`n` tasks of a split, skipping those envcheck found flaky or failing."""
    tasks = family.make_split(split, n + len(excluded), cfg.task.difficulty, cfg.task.subfamilies)
    return [t for t in tasks if t.task_id not in excluded][:n]


def open_run_dir(cfg: RunConfig, resume: bool) -> tuple[Path, Path | None]:
    require_trackers(cfg.log.report_to or [])  # a missing tracker package refuses the run before its directory exists
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
    """Held-out pass rate of `make_model()`'s sampler over every part (a joint run: each domain's
    held-out tasks in turn, one result over all of them), cached at `path`."""
    if path.exists():
        return EvalResult.load(path)
    model = make_model()
    cfg = prep.cfg
    parts = prep.parts or [Part(None, prep.family, prep.train_tasks, prep.heldout, cfg.rollout.max_new_tokens)]
    results = []
    with progress_bar(cfg.log.progress) as prog:
        bar = prog.add_task(f"eval {label}", total=len(prep.heldout), info="")
        for part in parts:
            results.append(evaluate(model, prep.tok, part.family, part.heldout, label, cfg.eval.max_new_tokens, cfg.eval.batch_size,
                                    cfg.rollout.exec_timeout_s, cfg.rollout.exec_workers, on_batch=lambda n: prog.advance(bar, n),
                                    samples=samples, temperature=temperature, seed=cfg.seed, max_turns=cfg.eval.max_turns,
                                    agent=cfg.rollout.agent_options(), max_tokens=cfg.model.context_length))
    res = results[0] if len(results) == 1 else EvalResult.concat(results)
    res.save(path)
    lo, hi = res.interval
    if cfg.log.progress:
        console.print(f"[bold]{label}[/]: held-out pass rate {100 * res.rate:.1f}% ({sum(res.passed)}/{len(res.passed)}, 95% [{100 * lo:.1f}, {100 * hi:.1f}])")
    return res
