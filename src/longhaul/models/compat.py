"""Small shims over transformers API differences between supported versions."""

from __future__ import annotations

import inspect
from functools import lru_cache


@lru_cache(maxsize=None)
def _names(forward) -> frozenset:
    return frozenset(inspect.signature(forward).parameters)


def cache_kwarg(module) -> str:
    """transformers 5.x renamed the KV-cache argument `past_key_values` to `cache`; accept both."""
    inner = module.get_base_model() if hasattr(module, "get_base_model") else module  # through a peft wrapper
    return "cache" if "cache" in _names(type(inner).forward) else "past_key_values"
