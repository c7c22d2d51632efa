"""What the scene3d browser tests share: `needs_browser()`, a skip with the fix where the browser
cannot run, and the `pool` fixture, a test module's own warm browser pool."""

from __future__ import annotations

import importlib.util

import pytest

from longhaul.envs.scene3d.browser import BrowserPool, chromium_path
from longhaul.envs.scene3d.export import three_build_dir
from longhaul.errors import LonghaulError


def needs_browser() -> None:
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright is not installed; pip install -e '.[scene3d]'")
    try:
        chromium_path(), three_build_dir()
    except LonghaulError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def pool():
    needs_browser()
    p = BrowserPool()
    yield p
    p.drop()
