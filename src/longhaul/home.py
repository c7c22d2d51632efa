"""Where longhaul keeps its files: `$LONGHAUL_HOME`, else `~/.cache/longhaul` (models, envcheck
manifest, sandbox toolchain, serve weights and jobs). Imports nothing heavy, so commands that
only need the path (`longhaul envcheck`) start without torch and transformers."""

import os
from pathlib import Path


def cache_home() -> Path:
    return Path(os.environ.get("LONGHAUL_HOME", Path.home() / ".cache" / "longhaul"))
