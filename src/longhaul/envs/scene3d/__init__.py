"""The `scene3d` family: 3D scenes built through ECS tool calls, exported as Three.js projects and
checked in a headless browser. `world` (the ECS), `assets` (the prefab library), `export` (the
Three.js project), `browser` (the warm Chromium), `verify` (the checks), `render` (pictures), `docs`
(the documentation search), `env` (the tools), `family` with `stage`, `tasks_look` and
`tasks_motion` (the tasks) and `demos` (demonstration scripts)."""

from longhaul.envs.scene3d.demos import demo_scripts
from longhaul.envs.scene3d.family import (
    DIFFICULTIES,
    FAMILY,
    SUBFAMILIES,
    VERSION,
    SceneTask,
    make_env,
    make_split,
    make_task,
)
from longhaul.envs.scene3d.render import render_episode

__all__ = ["DIFFICULTIES", "FAMILY", "SUBFAMILIES", "VERSION", "SceneTask", "demo_scripts", "make_env", "make_split", "make_task",
           "render_episode"]
