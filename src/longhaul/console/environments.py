"""The environments page's data: the envcheck manifest (`longhaul envcheck`), each family's entry
as checked, and whether it still describes the family's code (its content hash now).

Owns reading the manifest for the console; does not own checking families (`eval.envcheck`)
or the manifest's format.
"""

from __future__ import annotations

import json
from pathlib import Path

from longhaul.console.paths import ConsoleError
from longhaul.envs import get_family
from longhaul.errors import LonghaulError
from longhaul.eval.envcheck import manifest_path


def _currency(name: str, checked_hash: str | None) -> str:
    """'current' when the family's code still hashes to what was checked, 'stale' when it
    changed since (training refuses it until checked again), 'unknown family' when no such
    family is registered in this process."""
    try:
        now = get_family(name).content_hash()
    except (LonghaulError, KeyError, ValueError):
        return "unknown family"
    return "current" if now == checked_hash else "stale"


class Environments:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else manifest_path()

    def listing(self) -> dict:
        """Every family in the manifest, sorted by name; an empty list with a note before any check."""
        if not self.path.is_file():
            return {"manifest": str(self.path), "families": [],
                    "note": "no envcheck manifest yet: run `longhaul envcheck FAMILY` to validate a family's tasks"}
        try:
            data = json.loads(self.path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConsoleError(422, f"the envcheck manifest {self.path} is not valid JSON ({e}); delete it and run "
                                    "`longhaul envcheck` again") from e
        families = data.get("families") if isinstance(data, dict) else None
        if not isinstance(families, dict):
            raise ConsoleError(422, f"the envcheck manifest {self.path} has no 'families' object; delete it and run "
                                    "`longhaul envcheck` again")
        out, warnings = [], []
        for name, entry in sorted(families.items()):
            if not isinstance(entry, dict):
                warnings.append(f"the manifest's entry for {name!r} is not an object; skipped (run `longhaul envcheck {name}`)")
                continue
            out.append({**entry, "family": name, "currency": _currency(name, entry.get("content_hash"))})
        return {"manifest": str(self.path), "families": out, "warnings": warnings}
