"""Environments: the Env protocol (`base`), the workspace env and its tools, task families
(one module each) behind a registry, and the quality checks (`quality`).

A family makes deterministic tasks from seeds; answer families are single-turn and scored by a
verifier, workspace families are multi-turn and verified by hidden checks in the sandbox.
"""

from longhaul.envs.registry import Family, families, get_family

__all__ = ["Family", "families", "get_family"]
