"""The `scene3d` family: 3D scenes built through ECS tool calls, exported as Three.js projects and
checked in a headless browser. `world` (the ECS), `export` (the Three.js project), `browser` (the
warm Chromium), `verify` (the checks), `env` (the tools) and `family` (the tasks)."""

from longhaul.envs.scene3d.family import DIFFICULTIES, FAMILY, SUBFAMILIES, VERSION, SceneTask, make_env, make_split, make_task

__all__ = ["DIFFICULTIES", "FAMILY", "SUBFAMILIES", "VERSION", "SceneTask", "make_env", "make_split", "make_task"]
