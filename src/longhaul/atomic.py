"""Directories written whole or not at all: build in a temporary sibling, then rename over the target."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_dir(dst: Path):
    """Yield a fresh directory beside `dst` to fill. When the block ends normally it replaces `dst`
    (an existing `dst` is removed first); when it raises, `dst` is untouched and the temporary
    directory is deleted."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}.tmp-"))
    try:
        yield tmp
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
