import pytest


@pytest.fixture(scope="session", autouse=True)
def checked_families():
    """The GPU runs train on `echo` only (no sandbox needed on the GPU machine): validate just it."""
    from longhaul.eval.envcheck import run_envcheck

    run_envcheck(["echo"], n=6)
