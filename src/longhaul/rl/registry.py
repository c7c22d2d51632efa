"""Name -> function registries; configs pick algorithms by name, never by if-chains."""

from __future__ import annotations

import difflib
from typing import Callable

from longhaul.errors import LonghaulError


class Registry(dict):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable:
        def deco(fn):
            self[name] = fn
            return fn
        return deco

    def unknown(self, name: str) -> str:
        """The error line for a name not registered: the nearest name, or all of them."""
        near = difflib.get_close_matches(name, list(self), n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"choose one of {', '.join(sorted(self))}"
        return f"unknown {self.kind} {name!r}; {hint}"

    def get_fn(self, name: str) -> Callable:
        if name not in self:
            raise LonghaulError(self.unknown(name))
        return self[name]
