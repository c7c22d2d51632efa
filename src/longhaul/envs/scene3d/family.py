"""The `scene3d` task family: build or change a 3D scene, asked for in plain words, through the
ECS tools (`longhaul.envs.scene3d.env`); the exported Three.js page is checked in a browser.

Tasks are pure functions of `(seed, difficulty, subfamily)` drawn with the task kit
(`longhaul.envs.kit`), train and held-out seeds as the other generated families. The sub-families
live in `tasks_look` (composition, lighting, materials, camera, assets, instancing) and
`tasks_motion` (animation, physics, controls, hud, scripting, repair); `stage` holds what they
share. Every task starts from a scene with a camera (and, but for `lighting`, lights) and carries
its checks and a reference solution (the oracle's tool calls). Difficulty adds objects and fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from longhaul.envs import kit
from longhaul.envs.scene3d import tasks_look, tasks_motion  # noqa: F401  (they register the sub-families)
from longhaul.envs.scene3d.env import SceneEnv
from longhaul.envs.scene3d.stage import SUBFAMILIES

FAMILY = "scene3d"
VERSION = "2"
DIFFICULTIES = kit.DIFFICULTIES


@dataclass(frozen=True)
class SceneTask:
    task_id: str  # "scene3d/v{VERSION}/{subfamily}/d{difficulty}/{seed}": makes the same task again (render.task_from_id)
    family: str
    version: str
    seed: int
    difficulty: int
    subfamily: str
    instruction: str  # the user message
    start: str  # the starting world, as snapshot JSON
    checks: tuple  # verify's check dicts
    reference: tuple  # Actions that solve it (submit is added by the oracle)
    prompt: str = ""

    def __post_init__(self):
        if not self.prompt:
            object.__setattr__(self, "prompt", self.instruction)


# ------------------------------------------------------------------ public API --

def make_task(seed: int, difficulty: int = 1, subfamily: str | None = None) -> SceneTask:
    """The task for `seed` (its sub-family drawn from the seed unless given)."""
    kit.check_difficulty(difficulty)
    rng, sub = kit.draw(SUBFAMILIES, seed, subfamily)
    world, text, checks, ref = sub.build(rng, difficulty)
    return SceneTask(f"{FAMILY}/v{VERSION}/{sub.name}/d{difficulty}/{seed}", FAMILY, VERSION, seed, difficulty, sub.name, text,
                     json.dumps(world.snapshot(), sort_keys=True), tuple(checks), tuple(ref))


def make_split(split: str, n: int, difficulty: int = 1, subfamilies: list[str] | None = None) -> list[SceneTask]:
    """`n` tasks with seeds `SPLIT_SEED_BASE[split] + i` (train: 0, heldout: 1_000_000)."""
    return kit.split_tasks(make_task, SUBFAMILIES, split, n, difficulty, subfamilies)


def make_env(task=None) -> SceneEnv:
    """A fresh env; every env shares the process's warm browser."""
    return SceneEnv()
