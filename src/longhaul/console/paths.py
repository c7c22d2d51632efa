"""Where the console may read: the runs directory and nothing outside it.

Owns `RunsRoot`: run names (`agent`, or `agent/rl` for a pipeline's stage) to directories, and
files of a run, refusing absolute names, `..`, and symlinks that lead out of the root; which
directories are runs, and a run's config file (`read_config`). Owns
`ConsoleError`, an error with the HTTP status the API answers it with. Does not own what the
files mean (`runs`, `episodes`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import yaml

from longhaul.errors import LonghaulError

# files whose presence makes a directory a run: a trainer's config and metrics, a pipeline's config and summary
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "pipeline_config.json", "pipeline.json", "team_train_config.json")


class ConsoleError(LonghaulError):
    """A request the console cannot answer, with its HTTP status and a one-line fix."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RunsRoot:
    def __init__(self, root: Path):
        self.root = Path(root)
        if not self.root.is_dir():
            raise LonghaulError(f"runs directory {str(self.root)!r} does not exist; pass --runs DIR (a config's output_dir)")
        self.real = self.root.resolve()

    def inside(self, p: Path) -> bool:
        """Whether `p`, symlinks followed, lies within the runs directory."""
        return p.resolve().is_relative_to(self.real)

    def run_dir(self, name: str) -> Path:
        """The directory of run `name`: 400 for a name that is not a plain relative path, 404 for no such run."""
        parts = name.split("/")
        if not name or name.startswith("/") or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts):
            raise ConsoleError(400, f"run name {name!r} is not a path inside the runs directory; use a name from /api/runs")
        d = self.root.joinpath(*parts)
        if not d.is_dir() or not self.inside(d):
            raise ConsoleError(404, f"run {name!r} is not in {str(self.root)!r} (deleted or renamed?); go back to the runs list")
        return d

    def file(self, run: Path, name: str) -> Path | None:
        """A file of a run directory, or None when it is absent or a symlink out of the root."""
        p = run / name
        return p if p.is_file() and self.inside(p) else None

    def runs(self) -> list[str]:
        """Every run: directories at the top with a run marker, and their sub-directories with one
        (a pipeline's stages, `agent/sft`, `agent/rl`). Hidden directories are skipped."""
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".") or not d.is_dir() or not self.inside(d):
                continue
            if is_run(d):
                out.append(d.name)
            out += [f"{d.name}/{s.name}" for s in sorted(d.iterdir())
                    if not s.name.startswith(".") and s.is_dir() and is_run(s) and self.inside(s)]
        return out


def is_run(d: Path) -> bool:
    return any((d / m).is_file() for m in RUN_MARKERS)


def read_config(d: Path) -> tuple[str | None, dict]:
    """(file name, parsed config) of a run: config.yaml, a pipeline's pipeline_config.json or a
    team's team_train_config.json."""
    for name in ("config.yaml", "pipeline_config.json", "team_train_config.json"):
        p = d / name
        if p.is_file():
            st = p.stat()
            return name, _parsed(str(p), st.st_mtime_ns, st.st_size)
    return None, {}


@lru_cache(maxsize=4096)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    """A config file parsed once per version (the runs list asks for every run's, every few seconds)."""
    try:
        with open(path) as f:  # libyaml's loader where PyYAML has it: ~10x the pure-Python one
            cfg = yaml.load(f, Loader=SAFE_LOADER) if path.endswith(".yaml") else json.load(f)
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return cfg if isinstance(cfg, dict) else {}
