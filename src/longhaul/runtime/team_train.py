"""`longhaul team train CONFIG`: a team of roles trained from one base model, in the agent
pipeline's order: verified multi-role demonstrations, SFT on each policy's own turns, GRPO on team
episodes with advantages grouped by (task, role) and turn, and greedy held-out team pass rates of
the base, SFT and SFT+RL teams on the same tasks.

`policies: shared` trains one model that acts for every role (its role prompts tell them apart);
`per_role` trains one full copy per policy name of the workflow; `adapters` trains one LoRA
adapter per policy name over one base model: SFT trains each role's adapter on its own rows, RL
goes on with it (each adapter wraps a copy of the base that shares its weights), and one engine
holds the base and every adapter, so all roles' turns share its decoding steps; stage outputs are
adapter directories (`sft/<policy>/adapter`, `rl/<policy>/adapter`). `solo: true` trains the
workflow's single-agent counterpart instead (`workflows.solo`: one role, every tool, the team's
budgets), and `compare: [single, adapters]` runs those variants after the main run, each under
`runs/<name>/<variant>/`, with exact McNemar of the main run's last stage against each
variant's on the same held-out tasks.

Everything goes under `runs/<name>/`: `demos.jsonl`, `sft/<policy>/model`,
`rl/<policy>/model`, `sft/team.json` and `rl/team.json` (which model acts for each role),
`metrics.jsonl` (one line per RL step, per-role and per-policy keys), `eval_<stage>.json`,
`episodes_<stage>.jsonl`, `team_train.json` (every figure) and `report.html`. A stage whose output
exists is not run again.

Why a driver of its own and not a pipeline option: the pipeline's RL stage is the general online
runner (`runtime.train`: rollout workers, replay, async) over single-agent tasks; team episodes
need `run_team` and a trainer per policy. The SFT stage is the pipeline's own (`sft_run_config`,
`runtime.train` in a process of its own); the RL step is the ordinary `GRPOTrainer.step`. Episodes
that end in an infrastructure error are counted, and masked out of baselines and loss by the trainer.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator

from longhaul.agent.loop import AgentConfig, ModelPolicy
from longhaul.agent.team import run_team
from longhaul.agent.team_demos import build_team_demos
from longhaul.agent.team_run import summarize as summarize_roles
from longhaul.agent.workflows import family_tools, load_workflow, solo, workflow_from
from longhaul.config import ModelConfig, RunConfig, Section
from longhaul.envinfo import collect
from longhaul.envs import get_family
from longhaul.envs.datasets import write_jsonl
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError
from longhaul.eval.stats import mcnemar_exact, wilson
from longhaul.eval.team_report import write_team_report
from longhaul.hardware import resolve_device
from longhaul.inference import context_length
from longhaul.models import load_policy
from longhaul.models.lora import apply_lora, copy_adapter, is_adapter_dir, load_lora
from longhaul.rl.checkpoint import export_checkpoint, list_checkpoints, save_checkpoint
from longhaul.rl.grpo import GRPOTrainer
from longhaul.rl.teams import role_groups
from longhaul.runtime import train
from longhaul.runtime.pipeline import (
    _isolated,
    _long_rows_autocast,
    _merge,
    _run_config,
    _train_stage,
    _write_json,
    earlier_timing,
    sft_run_config,
)
from longhaul.runtime.pool import policy_tensors
from longhaul.runtime.progress import console, progress_bar
from longhaul.runtime.rollout import make_sampler


ADAPTER_RANK = 16  # policies: adapters, where the config names no rank


class TeamDemosConfig(Section):
    tasks: int = Field(16, ge=1)  # train tasks; one team episode per task and variant
    variants: list[str] = ["reference", "repair"]  # repairs teach the actor to recover from a failed call
    seed: int = 0


class TeamEvalConfig(Section):
    tasks: int = Field(20, ge=1)  # held-out tasks, the same for every stage (paired: exact McNemar)
    max_new_tokens: int = Field(192, ge=1)  # per reply
    workers: int = Field(4, ge=1)  # episodes at once where the sampler batches them (the engine)
    show: int = Field(3, ge=0)  # held-out episodes the report shows turn by turn, first stage beside last


class TeamTrainConfig(Section):
    """`longhaul team train`: demonstrations, SFT and GRPO of a workflow's roles, and the comparison."""
    name: str = "team"
    seed: int = 0
    output_dir: str = "runs"
    model: ModelConfig = ModelConfig(context_length=4096)
    workflow: str = "coder_tester"  # built-in, YAML file or package.module:Name (docs/teams.md)
    family: str = "bugfix"  # a workspace family whose tasks carry reference solutions
    difficulty: int = Field(1, ge=1, le=3)
    subfamilies: list[str] | None = None  # None: all of the family's
    # the workflow's own fields overridden for this run, e.g. {max_turns: 4, max_tokens: 3000}: an untrained
    # team rarely submits, so its episodes run the whole budget, and on CPU the budget is the run's wall clock
    budgets: dict = {}
    # one model for every role, a full copy per policy name, or one LoRA adapter per policy name over one base
    # (one engine batches every role's turns; SFT and RL train each adapter, rank `rl.train.lora_r`, default 16)
    policies: Literal["shared", "per_role", "adapters"] = "shared"
    solo: bool = False  # the workflow's single-agent counterpart in place of its team (workflows.solo), same budgets
    # after this run, the same run again with one thing changed, under runs/<name>/<variant>, each compared with
    # this run's last stage on the same held-out tasks: "single" (solo: true), or another policies setting
    compare: list[Literal["single", "shared", "per_role", "adapters"]] = []
    stages: list[Literal["sft", "rl"]] = ["sft", "rl"]  # [rl]: RL from the base with no cold start
    demos: TeamDemosConfig = TeamDemosConfig()
    sft: dict = {}  # overrides of the SFT stage's run config (as the pipeline's `sft`), e.g. {train: {steps: 16}}
    # with policies: adapters, applied over `sft`: a LoRA adapter wants about ten times a full fine-tune's learning rate
    adapter_sft: dict = {"train": {"lr": 1.0e-3}}
    # overrides of the RL stage's run config: rollout.prompts_per_step tasks a step, rollout.group_size episodes
    # each; rollout.max_new_tokens/temperature/sampler; algo (advantage turn_level by default); train (steps, lr, lora_r)
    rl: dict = {}
    eval: TeamEvalConfig = TeamEvalConfig()
    isolate: bool = True  # each stage in a process of its own: the run's memory peak is its largest stage's

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @model_validator(mode="after")
    def _check_compare(self) -> TeamTrainConfig:
        if len(set(self.compare)) < len(self.compare):
            raise LonghaulError(f"compare lists a variant twice: {self.compare}; name each once")
        if self.policies in self.compare:
            raise LonghaulError(f"compare names {self.policies!r}, this run's own policies; compare with the other one")
        if self.solo and self.compare:
            raise LonghaulError("compare is for a team run; a solo run is itself the single-agent variant: drop compare")
        return self

    def variant(self, name: str) -> TeamTrainConfig:
        """This run with one thing changed, under runs/<name>/<variant>."""
        change = {"solo": True, "policies": "shared"} if name == "single" else {"policies": name}
        return self.model_copy(update={**change, "name": f"{self.name}/{name}", "compare": []})


class TeamTrainer:
    def __init__(self, cfg: TeamTrainConfig):
        self.cfg, self.dir = cfg, cfg.run_dir
        self.family = get_family(cfg.family)
        self.wf = load_workflow(cfg.workflow, self.family)
        if cfg.budgets:
            self.wf = workflow_from({**self.wf.model_dump(by_alias=True), **cfg.budgets}, cfg.workflow).check_tools(
                family_tools(self.family), self.family.name)
        if cfg.solo:
            self.wf = solo(self.wf)
        names = sorted({r.policy for r in self.wf.roles})
        # which model acts for each of the workflow's policy names
        self.model_of = {p: "shared" if cfg.policies == "shared" else p for p in names}
        self.timing: dict[str, float] = {}
        if "sft" in cfg.stages:
            self.sft_config("shared", cfg.model.name, self.dir / "demos.jsonl")
        rl = self.rl_config(cfg.model.name)  # refused now, not after the stages before it have run
        if cfg.policies == "adapters" and rl.rollout.sampler != "engine":
            raise LonghaulError("policies: adapters runs every role's adapter on one engine; set rl.rollout.sampler to engine")

    @property
    def keys(self) -> list[str]:
        return sorted(set(self.model_of.values()))

    # ---- configs ---------------------------------------------------------------------------
    def _base(self, name: str, out: Path) -> dict:
        c = self.cfg
        return {"name": name, "output_dir": str(out), "seed": c.seed, "model": c.model.model_dump(), "log": {"report_to": []}}

    def sft_config(self, key: str, start: str, demos: Path) -> RunConfig:
        over = self.cfg.sft
        if self.cfg.policies == "adapters":  # each role's SFT trains its adapter, of the RL stage's rank unless told
            r = (self.cfg.rl.get("train") or {}).get("lora_r") or ADAPTER_RANK
            over = _merge(_merge({"train": {"lora_r": r, "lora_alpha": 2.0 * r}}, over), self.cfg.adapter_sft)
        return sft_run_config(self._base(key, self.dir / "sft"), start, demos, self.cfg.model.context_length or 4096, over)

    def rl_config(self, start: str) -> RunConfig:
        lora = {"lora_r": ADAPTER_RANK, "lora_alpha": 2.0 * ADAPTER_RANK} if self.cfg.policies == "adapters" else {}
        tree = _merge(self._base("rl", self.dir), {
            "model": {"name": start},
            "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": self.cfg.eval.max_new_tokens, "temperature": 1.0,
                        "context": "elide"},
            # turn_level: reply k of a role against the same role's k-th replies of the task's other episodes
            "algo": {"name": "grpo", "advantage": "turn_level", "kl_coef": 0.0},
            "train": {"steps": 4, "lr": 1e-5, "micro_batch": 2, "save_every": 0, "autocast": _long_rows_autocast(), **lora}})
        cfg = _run_config(_merge(tree, self.cfg.rl), "rl")
        if self.cfg.policies == "adapters" and not cfg.train.lora_r:
            raise LonghaulError("policies: adapters trains LoRA adapters; set rl.train.lora_r above 0 or choose per_role")
        return cfg

    # ---- stages ----------------------------------------------------------------------------
    def demos(self) -> Path:
        path = self.dir / "demos.jsonl"
        if path.exists():
            return path
        c, t0 = self.cfg, time.perf_counter()
        with progress_bar(True) as prog:
            bar = prog.add_task(f"team demonstrations: {self.wf.name}", total=c.demos.tasks * len(c.demos.variants), info="")
            rows = build_team_demos(self.family, self.wf, c.demos.tasks, c.difficulty, tuple(c.demos.variants), c.demos.seed,
                                    on_done=lambda trajs: prog.advance(bar), subfamilies=c.subfamilies)
        if not rows:
            raise LonghaulError(f"no team demonstration passed its hidden checks; run `longhaul envcheck {c.family}`")
        write_jsonl(rows, path)
        self.timing["demos"] = time.perf_counter() - t0
        console.print(f"{len({r['episode'] for r in rows})} verified team episodes, {len(rows)} per-role rows -> {path}")
        return path

    def sft(self, demos: Path) -> dict[str, str]:
        rows = [json.loads(line) for line in demos.read_text().splitlines()]
        out = {}
        adapters = self.cfg.policies == "adapters"
        for key in self.keys:
            model = self.dir / "sft" / key / ("adapter" if adapters else "model")
            if not _saved(model):
                mine = rows if key == "shared" else [r for r in rows if r["policy"] == key]
                data = write_jsonl(mine, self.dir / f"demos_{key}.jsonl")
                self._stage(f"sft_{key}", _adapter_stage if adapters else _train_stage,
                            self.sft_config(key, self.cfg.model.name, data), model)
            out[key] = str(model)
        self._manifest("sft", out)
        return out

    def rl(self, start: dict[str, str]) -> dict[str, str]:
        name = "adapter" if self.cfg.policies == "adapters" else "model"
        out = {key: str(self.dir / "rl" / key / name) for key in self.keys}
        if not all(_saved(p) for p in out.values()):
            self._stage("rl", _rl_stage, self.cfg, start)
        self._manifest("rl", out)
        return out

    def evaluate(self, stage: str, models: dict[str, str]) -> dict:
        path = self.dir / f"eval_{stage}.json"
        if not path.exists():
            self._stage(f"eval_{stage}", _eval_stage, self.cfg, stage, models)
        return json.loads(path.read_text())

    def _stage(self, key: str, fn, *args) -> None:
        t0 = time.perf_counter()
        _isolated(fn, *args) if self.cfg.isolate else fn(*args)
        self.timing[key] = time.perf_counter() - t0

    def _manifest(self, stage: str, models: dict[str, str]) -> None:
        roles = {r.name: models[self.model_of[r.policy]] for r in self.wf.roles}
        _write_json(self.dir / stage / "team.json", {"workflow": self.wf.name, "policies": self.cfg.policies, "roles": roles,
                                                     "base": self.cfg.model.name})

    def variant(self, name: str) -> TeamTrainer:
        """The trainer of a compared variant. One that changes only the policies starts with this run's
        base evaluation and demonstrations: every role runs the base model in the one, and the other
        does not depend on the model."""
        other = TeamTrainer(self.cfg.variant(name))
        if not other.cfg.solo:
            other.dir.mkdir(parents=True, exist_ok=True)
            for f in ("eval_base.json", "episodes_base.jsonl", "demos.jsonl"):
                if (self.dir / f).exists() and not (other.dir / f).exists():
                    shutil.copy2(self.dir / f, other.dir / f)
        return other

    # ---- the whole ---------------------------------------------------------------------------
    def run(self) -> dict:
        c = self.cfg
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.dir / "team_train_config.json", c.model_dump(mode="json"))
        self.timing = earlier_timing(self.dir / "team_train.json")
        base = {key: c.model.name for key in self.keys}
        evals = {"base": self.evaluate("base", base)}
        models = base
        if "sft" in c.stages:
            models = self.sft(self.demos())
            evals["sft"] = self.evaluate("sft", models)
        if "rl" in c.stages:
            models = self.rl(models)
            evals["rl"] = self.evaluate("rl", models)
        summary = summarize(evals, self.timing, c)
        if c.compare:
            summary["compared"] = {v: compared(evals, self.variant(v).run(), v) for v in c.compare}
        _write_json(self.dir / "team_train.json", summary)
        print_summary(summary)
        console.print(f"report: {write_team_report(self.dir, summary, c.eval.show)}")
        return summary


# ---- work done inside a stage's process --------------------------------------------------------
def _policies(trainer: TeamTrainer, models: dict, tok, run_cfg: RunConfig, seed: int, base=None) -> tuple[dict, dict]:
    """The rollout samplers by model key and the Policy for each of the workflow's policy names.
    With `base` (policies: adapters), one engine holds the base weights and each key's model is a
    LoRA adapter on it (a peft model or an adapter directory): every role's turns share its steps."""
    if base is None:
        samplers = {key: make_sampler(run_cfg, model, tok) for key, model in models.items()}
        acting = {key: ModelPolicy(s, tok, seed=seed) for key, s in samplers.items()}
    else:
        engine = make_sampler(run_cfg, base, tok)
        for key, model in models.items():
            engine.add_lora(key, model)
        samplers = {key: engine for key in models}
        acting = {key: ModelPolicy(engine, tok, seed=seed, lora=key) for key in models}
    return samplers, {p: acting[key] for p, key in trainer.model_of.items()}


def _saved(path) -> bool:
    """A stage's model is there: a whole model, or an adapter."""
    return (Path(path) / "config.json").exists() or is_adapter_dir(path)


def _adapter_stage(run_cfg: RunConfig, out: Path) -> None:
    """A LoRA SFT run whose adapter (not the merged model) is the stage's output."""
    train(run_cfg)
    copy_adapter(list_checkpoints(run_cfg.run_dir / "checkpoints")[-1], out)


def _sharing(base):
    """A copy of `base` whose weights are `base`'s own tensors: a LoRA wrapper per role, one base."""
    return copy.deepcopy(base, memo={id(t): t for t in [*base.parameters(), *base.buffers()]})


def _team_cfg(run_cfg: RunConfig, context: int, max_new_tokens: int, temperature: float) -> AgentConfig:
    opts = {k: v for k, v in run_cfg.rollout.agent_options().items() if k != "schedule"}
    return AgentConfig(max_tokens=context, max_new_tokens=max_new_tokens, temperature=temperature, keep_messages=True, **opts)


def _eval_stage(cfg: TeamTrainConfig, stage: str, paths: dict[str, str]) -> None:
    """Greedy team episodes on the held-out tasks; writes eval_<stage>.json and episodes_<stage>.jsonl."""
    tt = TeamTrainer(cfg)
    run_cfg = tt.rl_config(cfg.model.name)
    if any(is_adapter_dir(p) for p in paths.values()):  # adapters: one base, each role's adapter on it
        base, tok = load_policy(cfg.model.name, cfg.model.rope_scaling)
        _, policies = _policies(tt, paths, tok, run_cfg, cfg.seed, base=base)
    else:
        loaded = {key: load_policy(p, cfg.model.rope_scaling) for key, p in paths.items()}
        base, tok = next(iter(loaded.values()))
        _, policies = _policies(tt, {k: m for k, (m, _) in loaded.items()}, tok, run_cfg, cfg.seed)
    tasks = tt.family.make_split("heldout", cfg.eval.tasks, cfg.difficulty, cfg.subfamilies)
    context = cfg.model.context_length or context_length(base)
    with progress_bar(True) as prog:
        bar = prog.add_task(f"eval {stage}", total=len(tasks), info="")
        episodes = run_team(tt.wf, policies, tok, tt.family.make_env or (lambda t: WorkspaceEnv()), tasks,
                            _team_cfg(run_cfg, context, cfg.eval.max_new_tokens, 0.0), workers=cfg.eval.workers,
                            episodes=[f"eval_{stage}/{t.task_id}" for t in tasks], on_done=lambda trajs: prog.advance(bar))
    scored = [e[0].info["ended"] != "infra_error" for e in episodes]
    out = {**summarize_roles(episodes), "stage": stage, "task_ids": [t.task_id for t in tasks],
           "passed": [bool(e[0].info.get("passed")) for e in episodes], "scored": scored}
    write_jsonl(episode_rows(episodes), tt.dir / f"episodes_{stage}.jsonl")
    _write_json(tt.dir / f"eval_{stage}.json", out)


def episode_rows(episodes: list[list]) -> list[dict]:
    """One row per role and episode for `episodes_<stage>.jsonl`: the role's chat, the team's turn
    order and messages, its tokens and invalid calls (what the report shows turn by turn)."""
    return [{"task_id": t.info.get("task_id"), "episode": t.info.get("episode"), "role": t.info["role"],
             "passed": t.info.get("passed"), "ended": t.info["ended"],
             "why": t.info.get("truncated_by") or t.info.get("infra_error"), "messages": t.info.get("messages", []),
             "turn_log": t.info.get("team_turn_log", []), "team_messages": t.info.get("team_messages", []),
             "tokens": t.completion_len, "invalid_calls": t.info.get("invalid_calls", 0)} for e in episodes for t in e]


def _rl_stage(cfg: TeamTrainConfig, start: dict[str, str]) -> None:
    """GRPO on team episodes: each step, rollout.prompts_per_step train tasks x group_size episodes,
    regrouped by (task, role); each model's trainer steps on the groups of the roles it acts for."""
    tt = TeamTrainer(cfg)
    run_cfg = tt.rl_config(cfg.model.name)
    r, t = run_cfg.rollout, run_cfg.train
    torch.manual_seed(cfg.seed)
    models, tok, base = {}, None, None
    adapters = cfg.policies == "adapters"
    device = resolve_device(t.device)
    if adapters:  # one base model; each role's adapter (from SFT, or new) wraps a copy that shares its weights
        base, tok = load_policy(cfg.model.name, cfg.model.rope_scaling, device)
    for key, path in start.items():
        if adapters:
            twin = _sharing(base)
            models[key] = load_lora(twin, Path(path)) if is_adapter_dir(path) else \
                apply_lora(twin, t.lora_r, t.lora_alpha, t.lora_dropout, t.lora_targets, cfg.model.name)
            continue
        model, tok = load_policy(path, cfg.model.rope_scaling, device)
        models[key] = apply_lora(model, t.lora_r, t.lora_alpha, t.lora_dropout, t.lora_targets, path) if t.lora_r else model
    trainers = {key: GRPOTrainer(m, tok.pad_token_id, run_cfg.algo, t, r.temperature, r.max_new_tokens) for key, m in models.items()}
    samplers, policies = _policies(tt, models, tok, run_cfg, cfg.seed, base=base)
    tasks = tt.family.make_split("train", t.steps * r.prompts_per_step, cfg.difficulty, cfg.subfamilies)
    context = cfg.model.context_length or context_length(next(iter(models.values())))
    agent = _team_cfg(run_cfg, context, r.max_new_tokens, r.temperature)
    log = tt.dir / "metrics.jsonl"
    log.unlink(missing_ok=True)
    with progress_bar(True) as prog:
        bar = prog.add_task("team GRPO", total=t.steps, info="")
        for step in range(t.steps):
            t0 = time.perf_counter()
            batch = tasks[step * r.prompts_per_step:(step + 1) * r.prompts_per_step]
            ids = [(i, j) for i in range(len(batch)) for j in range(r.group_size)]
            episodes = run_team(tt.wf, policies, tok, tt.family.make_env or (lambda task: WorkspaceEnv()),
                                [batch[i] for i, _ in ids], agent, episodes=[f"rl/{step}/{i}/{j}" for i, j in ids],
                                groups=[i for i, _ in ids], workers=cfg.eval.workers)
            t_roll = time.perf_counter() - t0
            groups, keys = role_groups(episodes)
            m = {"step": step + 1, **step_metrics(episodes), "timing/rollout": t_roll}
            for key, trainer in trainers.items():
                mine = [g for g, (_, role) in zip(groups, keys) if tt.model_of[tt.wf.role(role).policy] == key]
                m.update({f"policy/{key}/{k}": v for k, v in trainer.step(mine).items()})
                if adapters:  # the engine's adapter of this key takes the trained one
                    samplers[key].add_lora(key, models[key], version=step + 1)
                elif samplers[key] is not models[key]:  # the engine holds a copy: give it the new weights
                    samplers[key].update_weights(policy_tensors(models[key]), step + 1)
                for p in policies.values():
                    if p.model is samplers[key]:
                        p.version = step + 1  # the trajectories it samples next carry the new version
            with log.open("a") as f:
                f.write(json.dumps(m) + "\n")
            prog.advance(bar)
            console.print(f"step {step + 1}: team reward {m['reward']:.2f}, infra errors {m['infra_errors']}, "
                          + ", ".join(f"{k.split('/')[1]} {m[k]:.0f} tok" for k in m if k.startswith("role/") and k.endswith("/tokens")))
    for key, model in models.items():
        ckpts = tt.dir / "rl" / key / "checkpoints"
        saved = save_checkpoint(ckpts, t.steps, model, tok, {"step": t.steps, **trainers[key].state_dict()}, keep_last=1)
        if adapters:
            copy_adapter(saved, ckpts.parent / "adapter")
        else:
            export_checkpoint(ckpts.parent, None, ckpts.parent / "model")


def step_metrics(episodes: list) -> dict:
    """A step's team figures and, per role, tokens, invalid calls, its own reward and its share of the
    team's reward (each passed episode's reward split over its roles by the replies each made)."""
    scored = [e for e in episodes if e and e[0].info["ended"] != "infra_error"]
    out = {"reward": sum(e[0].reward for e in scored) / max(1, len(scored)), "infra_errors": len(episodes) - len(scored),
           "episodes": len(episodes)}
    share: dict[str, float] = {}
    total = sum(e[0].reward for e in scored) or 1.0
    for e in scored:
        replies = sum(len(t.turns) for t in e) or 1
        for t in e:
            share[t.info["role"]] = share.get(t.info["role"], 0.0) + e[0].reward * len(t.turns) / replies / total
    for role, r in summarize_roles(episodes)["roles"].items():
        n = max(1, r["episodes"])
        out.update({f"role/{role}/tokens": r["tokens"] / n, f"role/{role}/invalid_calls": r["invalid_calls"] / n,
                    f"role/{role}/reward_share": share.get(role, 0.0)})
        own = [t.info["role_reward"] for e in scored for t in e if t.info["role"] == role and t.info.get("role_reward") is not None]
        if own:
            out[f"role/{role}/role_reward"] = sum(own) / len(own)
    return out


def summarize(evals: dict[str, dict], timing: dict, cfg: TeamTrainConfig) -> dict:
    """Per stage: held-out team pass@1 with its 95% Wilson interval and per-role figures; exact
    McNemar between consecutive stages and of the last stage against the base."""
    stages = {}
    for s, e in evals.items():
        k, n = sum(e["passed"]), len(e["passed"])
        stages[s] = {"passed": k, "n": n, "pass_rate": k / max(1, n), "ci95": list(wilson(k, n)),
                     "infra_errors": e["infra_errors"], "roles": e["roles"]}
    out = {"workflow": cfg.workflow, "solo": cfg.solo, "family": cfg.family, "policies": cfg.policies, "model": cfg.model.name,
           "run_dir": str(cfg.run_dir), "stages": stages}
    names = list(evals)
    for a, b in list(zip(names, names[1:])) + ([("base", names[-1])] if len(names) > 2 else []):
        out[f"{b}_vs_{a}"] = mcnemar_exact(evals[a]["passed"], evals[b]["passed"])
    out.update(timing_s={k: round(v, 1) for k, v in timing.items()}, config=cfg.model_dump(mode="json"), host=collect().get("cpu"),
               measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    return out


def compared(evals: dict[str, dict], other: dict, name: str) -> dict:
    """A variant's stages beside this run's, and exact McNemar of this run's last stage against the
    variant's last stage on the same held-out tasks."""
    mine = evals[list(evals)[-1]]
    theirs = json.loads((Path(other["run_dir"]) / f"eval_{list(other['stages'])[-1]}.json").read_text())
    if theirs["task_ids"] != mine["task_ids"]:
        raise LonghaulError(f"the {name} variant was evaluated on other tasks than this run; give both the same eval and seed")
    return {"stages": other["stages"], "timing_s": other["timing_s"],
            f"{mine['stage']}_vs_{name}_{theirs['stage']}": mcnemar_exact(theirs["passed"], mine["passed"])}


def print_summary(summary: dict) -> None:
    from rich.table import Table

    who = "single agent of " if summary.get("solo") else ""
    t = Table(title=f"held-out team pass@1: {who}{summary['workflow']} on {summary['family']} (greedy, same tasks every stage)")
    for col in ("stage", "passed", "pass rate", "95% interval", "infra errors", *(f"{r} tokens" for r in
                                                                                next(iter(summary["stages"].values()))["roles"])):
        t.add_column(col)
    for stage, row in summary["stages"].items():
        t.add_row(stage, f"{row['passed']}/{row['n']}", f"{100 * row['pass_rate']:.1f}%",
                  f"[{100 * row['ci95'][0]:.1f}, {100 * row['ci95'][1]:.1f}]", str(row["infra_errors"]),
                  *(str(r["tokens"]) for r in row["roles"].values()))
    console.print(t)
    for key in [k for k in summary if "_vs_" in k]:
        m = summary[key]
        console.print(f"{key}: gained {m['gained']}, lost {m['lost']}, exact McNemar p = {m['p_value']:.3g}")
    for name, c in summary.get("compared", {}).items():
        rows = ", ".join(f"{s} {r['passed']}/{r['n']}" for s, r in c["stages"].items())
        for key in [k for k in c if "_vs_" in k]:
            m = c[key]
            console.print(f"{name} variant ({rows}) -> {key}: gained {m['gained']}, lost {m['lost']}, "
                          f"exact McNemar p = {m['p_value']:.3g}")


def train_team(cfg: TeamTrainConfig) -> dict:
    return TeamTrainer(cfg).run()
