import atexit
import os
import shutil
import tempfile

# Keep every test's model cache and runs away from the user's home (and delete it at exit).
if "LONGHAUL_HOME" not in os.environ:
    os.environ["LONGHAUL_HOME"] = tempfile.mkdtemp(prefix="longhaul-test-home-")
    atexit.register(shutil.rmtree, os.environ["LONGHAUL_HOME"], ignore_errors=True)
# Some tests call the CLI's main() in this process; it would switch the whole test process to
# keeping its peak heap (`longhaul.malloc`). tests/test_malloc.py checks that setting itself.
os.environ.setdefault("LONGHAUL_MALLOC", "system")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def native():
    """The native kernel module; the test is skipped where it does not build."""
    from longhaul.ops import kernels

    mod = kernels.native()
    if mod is None:
        pytest.skip("the native kernels do not build on this machine (see the stderr line)")
    return mod


@pytest.fixture(scope="session", autouse=True)
def checked_families():
    """Training refuses families without a current envcheck manifest: validate the two the
    training tests use, once, into the test home."""
    from longhaul.eval.envcheck import run_envcheck

    run_envcheck(["echo", "funcgen"], n=6)


@pytest.fixture(autouse=True)
def one_thread_for_tiny_models(request):
    """Tiny models spend more on thread hand-offs than on maths, and the sandbox tests run
    subprocesses beside them: one torch thread is faster on 2 cores and never oversubscribes.
    Slow tests (the real SmolLM2) keep every core."""
    import torch

    if request.node.get_closest_marker("slow"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
