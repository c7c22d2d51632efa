import pytest

from longhaul.ops import kernels


@pytest.fixture(scope="module")
def native():
    """The native kernel module; the test is skipped where it does not build."""
    mod = kernels.native()
    if mod is None:
        pytest.skip("the native kernels do not build on this machine (see the stderr line)")
    return mod
