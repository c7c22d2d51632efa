import os
import tempfile

# Keep every test's model cache and runs away from the user's home.
os.environ.setdefault("LONGHAUL_HOME", tempfile.mkdtemp(prefix="longhaul-test-home-"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def checked_families():
    """Training refuses families without a current envcheck manifest: validate the two the
    training tests use, once, into the test home."""
    from longhaul.eval.envcheck import run_envcheck

    run_envcheck(["echo", "funcgen"], n=6)
