"""Export a scene world as a runnable, offline Three.js project.

The project is `index.html`, `scene.json` (the world's snapshot), `assets.json` (the prefab
library), `runtime.js` and `sim.js` (this package's runtime, which builds the Three.js scene from
scene.json and steps its simulation) and the vendored `three` build files.
It needs no network; browsers refuse ES modules from file:// pages, so serve the folder
(`python3 -m http.server -d PROJECT`), as the verifier does through a request route.

`three` comes from npm once per machine (`make scene3d`) into `~/.cache/longhaul/three`; this module
only copies it. It does not open a browser (see `verify`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from longhaul.envs.scene3d.assets import catalogue
from longhaul.envs.scene3d.world import World
from longhaul.errors import LonghaulError
from longhaul.home import cache_home

RUNTIME = tuple(Path(__file__).with_name(n) for n in ("runtime.js", "sim.js"))
THREE_FILES = ("three.module.js", "three.core.js")  # three.module.js imports three.core.js (three >= r171)
INDEX = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title><link rel="icon" href="data:,">
<style>body {{ margin: 0; background: #111; }} canvas {{ display: block; width: 640px; height: 480px; }}</style>
</head><body><canvas id="view" width="320" height="240"></canvas>
<div id="hud" style="position:absolute;left:0;top:0;width:640px;height:480px;pointer-events:none"></div>
<script>
window.__errors = [];  /* set before the module runs, so that its own top-level errors are caught */
window.addEventListener('error', (e) => window.__errors.push(String(e.message || e)));
window.addEventListener('error', (e) => {{  /* a script or module that failed to load: seen only while capturing */
  if (e.target && e.target !== window) window.__errors.push('could not load ' + (e.target.src || e.target.href || e.target.tagName));
}}, true);
window.addEventListener('unhandledrejection', (e) => window.__errors.push('unhandled rejection: ' + String(e.reason)));
</script>
<script type="module" src="./runtime.js"></script>
</body></html>
"""


def three_build_dir() -> Path:
    """The vendored three build folder: `$LONGHAUL_THREE_DIR`, else the npm cache under
    `$LONGHAUL_HOME/three` or `~/.cache/longhaul/three` (where `make scene3d` puts it; a machine-wide
    cache, so a test run with its own LONGHAUL_HOME still finds it)."""
    forced = os.environ.get("LONGHAUL_THREE_DIR")
    roots = [Path(forced)] if forced else [cache_home() / "three", Path.home() / ".cache" / "longhaul" / "three"]
    builds = [r / "node_modules" / "three" / "build" if not forced else r for r in roots]
    for build in builds:
        if (build / "three.module.js").is_file():
            return build
    raise LonghaulError(f"three.js is not installed at {builds[-1]}; run `make scene3d` "
                        f"(npm install --prefix {roots[-1]} three) or set LONGHAUL_THREE_DIR to its build folder")


def export_project(world: World, out: Path, title: str = "scene3d") -> Path:
    """Write the runnable project of `world` into folder `out` (created; existing files replaced)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    build = three_build_dir()
    for name in THREE_FILES:
        if (build / name).is_file():
            shutil.copyfile(build / name, out / name)
    for src in RUNTIME:
        shutil.copyfile(src, out / src.name)
    (out / "scene.json").write_text(json.dumps(world.snapshot(), indent=1))
    (out / "assets.json").write_text(json.dumps(catalogue()))
    (out / "index.html").write_text(INDEX.format(title=title))
    return out
