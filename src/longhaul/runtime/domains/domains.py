"""Training domains: what a joint run trains on, and how much of it.

A domain is one task family (built-in or `package.module:Name`) at one difficulty and set of
sub-families, with a sampling weight, a priority, an optional budget (episodes or tokens), its
own rollout limits and optionally its own reward shaping. `DomainConfig` is the config record
(one YAML list item); `build_domains` turns the list into `Domain`s: it resolves each family,
refuses one whose envcheck manifest entry is missing, stale or failing (the same
`require_checked` gate as a single-family run), pins the version when the config names one, and
draws the domain's training pool with envcheck's excluded tasks left out.

This module owns the spec and its validation; how domains share rollout slots is `queues` and
`scheduler`, what is measured per domain is `metrics`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from longhaul.config import DomainConfig, SchedulingConfig  # noqa: F401 (the config models live with the others; re-exported)
from longhaul.envs import get_family
from longhaul.envs.registry import reward_family
from longhaul.errors import LonghaulError
from longhaul.eval.envcheck import require_checked
from longhaul.sandbox.spec import SandboxSpec


@dataclass(frozen=True)
class RolloutLimits:
    """A domain's own rollout limits; None means the run's rollout section decides."""
    max_turns: int | None = None
    max_new_tokens: int | None = None
    exec_timeout_s: float | None = None
    sandbox: dict = field(default_factory=dict)

    def sandbox_spec(self, base=None):
        """`base` (a SandboxSpec, default the library default) with this domain's overrides."""
        return dataclasses.replace(base or SandboxSpec(), **self.sandbox)


@dataclass
class Domain:
    """A resolved domain: its tasks and everything the scheduler needs to share slots."""
    name: str
    tasks: list  # the training pool, objects with .task_id
    weight: float = 1.0
    priority: int = 0
    budget_episodes: int | None = None
    budget_tokens: int | None = None
    version: str = ""
    family: object = None  # the Family (None for synthetic domains in tests and simulations)
    limits: RolloutLimits = field(default_factory=RolloutLimits)
    reward_scale: float = 1.0
    reward_offset: float = 0.0
    curriculum: str | None = None  # None: the scheduler's default

    def __post_init__(self):
        if not self.tasks:
            raise LonghaulError(f"domain {self.name!r} has no training tasks; raise its `tasks` or check its sub-families")
        if not self.weight > 0:
            raise LonghaulError(f"domain {self.name!r} has weight {self.weight}; weights must be > 0")
        ids = [t.task_id for t in self.tasks]
        if len(set(ids)) != len(ids):
            raise LonghaulError(f"domain {self.name!r} has repeated task ids; a family's make_split must give distinct ids")

    def shape(self, reward: float) -> float:
        """The reward the trainer sees for one of this domain's episodes."""
        return self.reward_scale * reward + self.reward_offset

    def fingerprint(self) -> str:
        """Hash of the pool's task ids: a resumed run must draw from the same pool."""
        return hashlib.sha256("\0".join(t.task_id for t in self.tasks).encode()).hexdigest()[:16]


def _check_sandbox(key: str, overrides: dict) -> None:

    valid = {f.name for f in dataclasses.fields(SandboxSpec)} - {"python", "env", "env_allow", "ro_binds"}
    bad = sorted(set(overrides) - valid)
    if bad:
        raise LonghaulError(f"domain {key!r}: unknown sandbox key {bad[0]!r}; valid keys: {', '.join(sorted(valid))}")
    try:
        SandboxSpec(**overrides)
    except (TypeError, ValueError) as e:
        raise LonghaulError(f"domain {key!r}: sandbox {e}") from e


def build_domain(cfg: DomainConfig, manifest: Path | None = None) -> Domain:
    """Resolve one domain: family, version pin, envcheck gate, reward, training pool."""
    key = cfg.key
    fam = get_family(cfg.family)
    if cfg.version is not None and cfg.version != fam.version:
        raise LonghaulError(f"domain {key!r} pins version {cfg.version!r} of family {fam.name!r}, but the installed family is "
                            f"version {fam.version!r}; update the pin (and run `longhaul envcheck {fam.name}`)")
    if "train" not in fam.splits:
        raise LonghaulError(f"domain {key!r}: family {fam.name!r} is evaluation-only (splits {', '.join(fam.splits)}); "
                            "it cannot be a training domain")
    if cfg.difficulty not in fam.difficulties:
        raise LonghaulError(f"domain {key!r}: family {fam.name!r} has difficulties {list(fam.difficulties)}, not {cfg.difficulty}")
    unknown = sorted(set(cfg.subfamilies or ()) - set(fam.subfamilies))
    if unknown:
        raise LonghaulError(f"domain {key!r}: family {fam.name!r} has no sub-family {unknown[0]!r}; "
                            f"choose from {', '.join(fam.subfamilies) or '(none)'}")
    _check_sandbox(key, cfg.sandbox)
    excluded = require_checked(fam, manifest) if cfg.require_envcheck else set()
    if cfg.reward:
        fam = reward_family(fam, cfg.reward)
    try:
        pool = fam.make_split("train", cfg.tasks + len(excluded), cfg.difficulty, cfg.subfamilies)
    except ValueError as e:
        raise LonghaulError(f"domain {key!r}: {e}") from e
    pool = [t for t in pool if t.task_id not in excluded][:cfg.tasks]
    limits = RolloutLimits(cfg.max_turns, cfg.max_new_tokens, cfg.exec_timeout_s, dict(cfg.sandbox))
    return Domain(key, pool, cfg.weight, cfg.priority, cfg.budget_episodes, cfg.budget_tokens, fam.version, fam, limits,
                  cfg.reward_scale, cfg.reward_offset, cfg.curriculum)


def build_domains(cfgs: list[DomainConfig], manifest: Path | None = None) -> list[Domain]:
    """All domains of a run, in config order (the order breaks ties, so it is part of the seed)."""
    if not cfgs:
        raise LonghaulError("the `domains:` list is empty; list at least one domain (docs/scheduling.md)")
    seen: dict[str, int] = {}
    for i, c in enumerate(cfgs):
        if c.key in seen:
            raise LonghaulError(f"domains {seen[c.key]} and {i} are both named {c.key!r}; give each a distinct `name`")
        seen[c.key] = i
    return [build_domain(c, manifest) for c in cfgs]
