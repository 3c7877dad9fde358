import os
import sys

import pytest

# The package under test is the source tree's python/qlink.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def pytest_addoption(parser):
    parser.addoption("--qlink-library", required=True, help="path of the built libqlink.so")


@pytest.fixture(scope="session")
def library(request):
    return os.path.abspath(request.config.getoption("--qlink-library"))


@pytest.fixture
def cpu4(library):
    import qlink
    with qlink.load({"backend": "cpu", "cpu_devices": 4, "log_level": "off"}, library=library) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def ctx(library):
    """The CUDA backend as the process default context, every pair's peer access enabled
    (GPU tests only: they skip before asking for it where there is no GPU)."""
    import qlink
    ctx = qlink.configure({"backend": "cuda", "log_level": "warn"}, library=library)
    ctx.enable_peer_access()
    return ctx
