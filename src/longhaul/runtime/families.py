"""The task families a run's config names, as rollout workers and sandbox pools both build them:
the run's one family (its reward replaced where configured), or each domain of a joint run with
its limits, sandbox override and reward shaping."""

from __future__ import annotations

from dataclasses import dataclass, replace

from longhaul.envs import get_family
from longhaul.envs.registry import reward_family
from longhaul.envs.workspace import WorkspaceEnv, WorkspaceLimits


def build_family(cfg):
    """The task family a run trains on, with its reward replaced where the config says so."""
    family = get_family(cfg.task.family)
    if cfg.task.reward:
        family = reward_family(family, cfg.task.reward)
    if cfg.task.reward_model:
        from longhaul.rl.reward_model import reward_model_family  # loads torch and a model: only when configured

        family = reward_model_family(family, cfg.task.reward_model)
    return family


@dataclass(frozen=True)
class DomainRun:
    """What a worker needs to roll out one domain of a joint run."""
    family: object
    max_turns: int
    max_new_tokens: int
    exec_timeout_s: float
    make_env: object  # task -> Env for workspace families with a sandbox override, else None
    scale: float
    offset: float


def domain_runs(cfg) -> dict[str, DomainRun]:
    """Each domain's family (its reward replaced where configured), limits and shaping; the task
    pools stay with the scheduler."""
    out = {}
    for d in cfg.domains:
        fam = get_family(d.family)
        if d.reward:
            fam = reward_family(fam, d.reward)
        make_env = None
        if d.sandbox:
            limits = WorkspaceLimits(spec=replace(WorkspaceLimits().spec, **d.sandbox))
            make_env = lambda task, limits=limits: WorkspaceEnv(limits)  # noqa: E731
        r = cfg.rollout
        out[d.key] = DomainRun(fam, d.max_turns or r.max_turns, d.max_new_tokens or r.max_new_tokens,
                               d.exec_timeout_s or r.exec_timeout_s, make_env, d.reward_scale, d.reward_offset)
    return out


