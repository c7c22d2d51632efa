"""`echo`: repeat a given word. A dense-reward family a tiny random model can learn.

The reward is the similarity ratio between the reply and the target (difflib), so even a
random policy sees reward variance within a group: this is what the tiny smoke runs train on.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass

from longhaul.envs.kit import SPLIT_SEED_BASE
from longhaul.types import Score

VERSION = "1"
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa")


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    version: str
    seed: int
    difficulty: int
    target: str
    prompt: str


def make_task(seed: int, difficulty: int = 1) -> Task:
    rng = random.Random(seed)
    word = "".join(rng.choice(_SYLLABLES) for _ in range(1 + difficulty))
    return Task(f"echo/v{VERSION}/d{difficulty}/{seed}", "echo", VERSION, seed, difficulty, word, f"Say {word}")


def make_split(split: str, n: int, difficulty: int = 1, subfamilies=None) -> list[Task]:
    if split not in SPLIT_SEED_BASE:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLIT_SEED_BASE)}")
    base = SPLIT_SEED_BASE[split]
    return [make_task(base + i, difficulty) for i in range(n)]


def score_many(tasks, replies: list[str], timeout_s: float = 0.0, workers: int = 1):
    out = []
    for t, r in zip(tasks, replies):
        ratio = difflib.SequenceMatcher(None, r.strip(), t.target).ratio()
        out.append(Score(ratio, r.strip() == t.target, "pass" if r.strip() == t.target else "fail"))
    return out
