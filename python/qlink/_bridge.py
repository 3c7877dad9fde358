"""The package's torch side in C (libqlink_torch.so, built from python/bridge), bound to
this PyTorch's stable C shim. get() returns it, or None where it or the shim is missing
(PyTorch before 2.3, a free-threaded CPython): callers then take their plain-Python path,
which gives the same results more slowly."""
import importlib.util
import os
import sysconfig
import threading

import numpy as np
import torch

# describe()'s record per tensor (Leaf in python/bridge/torch_shim.h).
LEAF = np.dtype([("data", "<u8"), ("nbytes", "<i8"), ("device", "<i4"), ("flags", "<u4")])
CONTIGUOUS = 1

_module = None
_tried = set()
_lock = threading.Lock()


def get():
    return _module


def gpu():
    """The bridge where it can also read PyTorch's current GPU streams (copies, moves and
    prepared runs go through it then), else None."""
    return _module if _module is not None and _module.has_streams() else None


def import_module(path):
    """libqlink_torch.so at `path` as a Python module, not yet bound."""
    spec = importlib.util.spec_from_file_location("qlink_torch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(directory):
    """Binds libqlink_torch.so found in `directory` unless a bridge is bound already."""
    global _module
    with _lock:
        if _module is not None or directory in _tried:
            return
        _tried.add(directory)
        path = os.path.join(directory, "libqlink_torch.so")
        aoti = getattr(torch._C, "_aoti", None)
        # A limited-API module is built for the GIL's object layout: a free-threaded
        # CPython must not load it.
        if (not os.path.exists(path) or not hasattr(aoti, "unsafe_alloc_void_ptrs_from_tensors")
                or sysconfig.get_config_var("Py_GIL_DISABLED")):
            return
        torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        gpu_lib = next((p for p in (os.path.join(torch_lib, name) for name in ("libtorch_cuda.so", "libtorch_hip.so"))
                        if os.path.exists(p)), None)
        try:
            module = import_module(path)
            module.bind(os.path.join(torch_lib, "libtorch_cpu.so"), gpu_lib, aoti.unsafe_alloc_void_ptrs_from_tensors,
                        aoti.alloc_tensors_by_stealing_from_void_ptrs)
        except (ImportError, OSError):  # an older shim without some function: the Python path
            return
        _module = module
