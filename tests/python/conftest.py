import contextlib
import os
import sys

import pytest

# The package under test is the source tree's python/qlink.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def pytest_addoption(parser):
    parser.addoption("--qlink-library", required=True, help="path of the built libqlink.so")
    parser.addoption("--layout-dump", help="tests/abi_compat/layout_json: the header's layout as JSON")


@pytest.fixture(scope="session", autouse=True)
def serial_torch_blas():
    """PyTorch's BLAS on one thread for the whole run where it is OpenBLAS: the CPU engine
    runs it so inside its calls, tests compare PyTorch's products with the engine's bit for
    bit, and a product's rounding depends on how many threads split it."""
    from gptq_reference import serial_blas, torch_linalg_files
    files = torch_linalg_files()
    with serial_blas(files[0]) if files else contextlib.nullcontext():
        yield


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


@pytest.fixture(params=["bridge", "python"])
def torch_side(request, library, monkeypatch):
    """Runs a test through the package's C bridge to torch and through its plain-Python
    path; the bridge run skips where PyTorch has no stable C shim (before 2.3)."""
    from qlink import _bridge
    _bridge.load(os.path.dirname(library))
    if request.param == "python":
        monkeypatch.setattr(_bridge, "_module", None)
    elif _bridge.get() is None:
        pytest.skip("the bridge is not bound: this PyTorch has no stable C shim")
    return request.param
