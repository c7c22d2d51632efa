"""The procedural task kit: what the generated families (funcgen, terminal, multistep) share.

A generated family is a registry of sub-families, each a builder ``(rng, difficulty) -> spec``
registered with ``@register(name)``, and a ``make_task(seed, difficulty, subfamily)`` that is a
pure function of its arguments: a private ``random.Random(seed)`` draws the sub-family (also when
one is forced, so the rest of the stream does not depend on forcing) and then everything in the
task. This module owns what does not depend on a task's shape: the registry, the seeded draw,
the train/held-out splits, the value for a difficulty, and pseudo-words and lines of text.

It does not know what a task is: funcgen's `Task` is its own, and the workspace tasks of terminal
and multistep are packed for the state checker by `longhaul.envs.state_task`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

DIFFICULTIES = (1, 2, 3)
SPLIT_SEED_BASE = {"train": 0, "heldout": 1_000_000}  # a split's seeds are base, base + 1, ...


@dataclass(frozen=True)
class SubFamily:
    name: str
    build: Callable[[random.Random, int], object]  # (rng, difficulty) -> the family's spec of one task
    names: tuple = ()  # the names a task may give its entry point (funcgen)


def make_registry():
    """A sub-family dict and the decorator ``@register(name, *names)`` that fills it."""
    registry: dict[str, SubFamily] = {}

    def register(name: str, *names: str):
        def deco(build):
            registry[name] = SubFamily(name, build, names)
            return build
        return deco

    return registry, register


def check_difficulty(difficulty) -> None:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")


def draw(registry: dict, seed: int, subfamily: str | None = None) -> tuple[random.Random, SubFamily]:
    """The task's private rng and its sub-family, drawn from ``seed`` unless ``subfamily`` is given."""
    names = sorted(registry)
    if subfamily is not None and subfamily not in registry:
        raise ValueError(f"unknown sub-family {subfamily!r}; valid: {', '.join(names)}")
    rng = random.Random(seed)
    drawn = names[rng.randrange(len(names))]  # drawn even when forced, so the rest of the stream is the same
    return rng, registry[drawn if subfamily is None else subfamily]


def split_tasks(make, registry: dict, split: str, n: int, difficulty: int = 1, subfamilies: list[str] | None = None) -> list:
    """``make(seed, difficulty, subfamily)`` for the ``n`` seeds ``SPLIT_SEED_BASE[split] + i``; with
    ``subfamilies``, each seed draws one of them (else ``make`` draws from the whole registry)."""
    if split not in SPLIT_SEED_BASE:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLIT_SEED_BASE)}")
    check_difficulty(difficulty)
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    pool = None
    if subfamilies is not None:
        pool = list(subfamilies)
        unknown = [s for s in pool if s not in registry]
        if unknown or not pool:
            raise ValueError(f"unknown or empty sub-family list {unknown or pool}; valid: {', '.join(sorted(registry))}")
    base = SPLIT_SEED_BASE[split]
    out = []
    for seed in range(base, base + n):
        chosen = None if pool is None else pool[random.Random(seed).randrange(len(pool))]
        out.append(make(seed, difficulty, chosen))
    return out


def pick(d: int, *levels):
    """The entry of ``levels`` for difficulty ``d`` (1-based)."""
    return levels[d - 1]


# ------------------------------------------------------------------ text --

_CONS = "bdfghklmnprstvz"
_VOWELS = "aeiou"


def word(rng: random.Random, lo: int = 2, hi: int = 3) -> str:
    """A pronounceable lowercase pseudo-word of lo..hi syllables."""
    return "".join(rng.choice(_CONS) + rng.choice(_VOWELS) for _ in range(rng.randint(lo, hi)))


def words(rng: random.Random, n: int, lo: int = 2, hi: int = 3, avoid=()) -> list[str]:
    """n distinct pseudo-words, none in ``avoid``, in draw order."""
    seen, out = set(avoid), []
    while len(out) < n:
        w = word(rng, lo, hi)
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def sentence(rng: random.Random, lo: int = 3, hi: int = 7) -> str:
    return " ".join(word(rng, 1, 3) for _ in range(rng.randint(lo, hi)))


def lines(items) -> str:
    return "".join(f"{x}\n" for x in items)
