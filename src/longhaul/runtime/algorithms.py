"""Every training algorithm by name: the one list `algo.name` accepts and the drivers dispatch on.

An algorithm is online (it learns from its own rollouts: `runtime.sync` runs it, in sync or async
mode) or offline (it learns from a dataset: `runtime.offline` runs it), and names the object that
builds its trainer as "module:attribute", imported only when a run starts, so that the config can
import this module without torch:
- online: a function `(cfg, policy, tok) -> trainer` with `step(groups)`, `state_dict()` and
  `load_state_dict()` (`rl.grpo.GRPOTrainer` is the reference);
- offline: an `offline.OfflineAlgo` (how a row is encoded, how its trainer is built, the report's
  curves).

A new algorithm is one `register_algorithm` call made before the config is loaded
(docs/training.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Literal

from longhaul.errors import LonghaulError
from longhaul.rl.registry import Registry

Driver = Literal["online", "offline"]


@dataclass(frozen=True)
class Algorithm:
    name: str
    driver: Driver
    builder: str  # "package.module:attribute"

    def load(self):
        module, _, attr = self.builder.partition(":")
        try:
            return getattr(import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise LonghaulError(f"algorithm {self.name!r}: cannot import its builder {self.builder!r} ({e}); "
                                "register it with an importable 'package.module:attribute'") from e


ALGORITHMS = Registry("algorithm")
_LEARNS_FROM = {"online": "its own rollouts, not a dataset; run it with `longhaul train` and a task",
                "offline": "a dataset, not from rollouts; run it with `longhaul train` and data.path"}


def builder(name: str, driver: Driver):
    """The builder of algorithm `name`, which the `driver` loop runs; one line if another loop runs it."""
    algo = ALGORITHMS.get_fn(name)
    if algo.driver != driver:
        raise LonghaulError(f"algo.name={name} learns from {_LEARNS_FROM[algo.driver]}")
    return algo.load()


def register_algorithm(name: str, driver: Driver, builder: str) -> Algorithm:
    """Add (or replace) the algorithm `name`; `builder` is "package.module:attribute"."""
    if driver not in ("online", "offline"):
        raise LonghaulError(f"algorithm {name!r}: driver {driver!r} is not 'online' or 'offline'")
    if builder.count(":") != 1 or not all(builder.split(":")):
        raise LonghaulError(f"algorithm {name!r}: builder {builder!r} is not 'package.module:attribute'")
    ALGORITHMS[name] = algo = Algorithm(name, driver, builder)
    return algo


for _name, _driver, _builder in (
    ("grpo", "online", "longhaul.runtime.online:grpo_trainer"),
    ("ppo", "online", "longhaul.runtime.online:ppo_trainer"),
    ("onpolicy_distill", "online", "longhaul.runtime.online:onpolicy_distill_trainer"),
    ("sft", "offline", "longhaul.runtime.offline:SFT"),
    ("rm", "offline", "longhaul.runtime.offline:RM"),
    ("dpo", "offline", "longhaul.runtime.offline:DPO"),
    ("distill", "offline", "longhaul.runtime.offline:DISTILL"),
):
    register_algorithm(_name, _driver, _builder)
