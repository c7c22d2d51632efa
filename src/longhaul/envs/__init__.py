"""Task families and their verifiers.

A family is a module that makes deterministic tasks from seeds (`make_split`) and scores a
model's answer (`score_many`). The multi-turn Env protocol of the environments issue builds
on these; for now the families are single-turn.
"""

from longhaul.envs.registry import FAMILIES, get_family

__all__ = ["FAMILIES", "get_family"]
