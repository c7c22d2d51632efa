"""The test tree itself: pytest's default (rootdir-relative, no packages) import mode needs every
test module's basename to be unique, else a clean run stops at collection."""

from collections import Counter
from pathlib import Path


def test_test_module_basenames_are_unique():
    root = Path(__file__).parent
    names = Counter(p.name for p in root.rglob("test_*.py") if "__pycache__" not in p.parts)
    clashes = sorted(n for n, c in names.items() if c > 1)
    assert not clashes, f"rename these test modules, their basenames clash: {clashes}"
