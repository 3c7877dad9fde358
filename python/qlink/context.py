"""A loaded plugin and one qlink context. The Context owns every call: devices and peers
(peers.py), copies (copy_calls.py), moves (moves.py), collectives (collective_calls.py),
replicas (replicas.py) and the native quantization engine (engine.py) are its methods.
None of them imports what sits above the Context: the default context (defaults.py) and
the module-level functions and prepared replays that use it (p2p.py, copies.py,
collectives.py)."""
import ctypes
import os
import threading

import numpy as np

from . import _abi, _bridge
from .collective_calls import CollectiveCalls
from .config import resolve
from .copy_calls import CopyCalls
from .engine import EngineCalls
from .errors import VersionMismatchError, error_for
from .moves import MoveCalls
from .peers import PeerCalls
from .replicas import ReplicaCalls
from .streams import StreamArray

_LIBRARIES = {}
_LIBRARIES_LOCK = threading.Lock()


def default_library_path():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libqlink.so")


def _negotiate(path):
    """dlopens libqlink.so once per path and returns its ABI 1.x function table."""
    path = os.path.abspath(path)
    with _LIBRARIES_LOCK:
        if path in _LIBRARIES:
            return _LIBRARIES[path]
        if not os.path.exists(path):
            raise FileNotFoundError("libqlink.so not found at %s: pass qlink.load(library=PATH)" % path)
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        get_api = lib.qlink_get_api
        get_api.restype = ctypes.POINTER(_abi.Api)
        get_api.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_char_p)]
        error = ctypes.c_char_p()
        table = get_api(_abi.ABI_MAJOR, _abi.ABI_MINOR, ctypes.byref(error))
        if not table:
            raise VersionMismatchError(_abi.VERSION_MISMATCH, "%s: %s (this qlink package speaks ABI %d.%d)" % (
                path, error.value.decode(), _abi.ABI_MAJOR, _abi.ABI_MINOR))
        api = table.contents
        _LIBRARIES[path] = (lib, api)
        _bridge.load(os.path.dirname(path))  # the torch side ships beside the plugin
        return lib, api


class Context(PeerCalls, CopyCalls, MoveCalls, CollectiveCalls, ReplicaCalls, EngineCalls):
    """One qlink_context. Every method may be called from many threads at once.

    config: None (defaults), a P2PConfig, a dict of P2PConfig's fields, or a dict of the
    whole JSON config. library: path of libqlink.so; by default the one in qlink/lib/."""

    def __init__(self, config=None, library=None):
        settings = resolve(config)
        self._lib, self._api = _negotiate(library or default_library_path())
        handle = ctypes.c_void_p()
        self.check(self._api.context_create(settings.plugin_json.encode(), ctypes.byref(handle)))
        self._handle = handle
        self.use_torch_replicate = settings.use_torch_replicate
        name = ctypes.c_char_p()
        self.invoke("backend_name", ctypes.byref(name))
        self.backend = name.value.decode()
        count = ctypes.c_int32()
        self.invoke("device_count", ctypes.byref(count))
        self.device_count = count.value
        self.device_type = {"cpu": _abi.KDL_CPU, "cuda": _abi.KDL_CUDA, "hip": _abi.KDL_ROCM}.get(
            self.backend, _abi.KDL_CPU)
        # What the torch bridge calls the plugin through: copy_batch's address, this context.
        self._bridge_plugin = (self.function_address("copy_batch"), self._handle.value, self.device_type)

    # The plugin's calls, for the methods of the topic classes above.

    @property
    def closed(self):
        return not getattr(self, "_handle", None)

    @property
    def abi_version(self):
        """(major, minor) of the ABI the loaded library provides."""
        return self._api.abi_major, self._api.abi_minor

    @property
    def cpu_memory(self):
        """Whether this backend's devices live in CPU memory (the CPU and test backends):
        there are no PyTorch GPU streams to order against then."""
        return self.device_type == _abi.KDL_CPU

    def check(self, status):
        """Raises the error for a qlink_status with this thread's message (OK passes)."""
        if status != _abi.OK:
            raise error_for(status, self._api.last_error().decode())

    def invoke(self, name, *args):
        """The ABI function `name` on this context's handle and `args`, checked."""
        self.check(getattr(self._api, name)(self._handle, *args))

    def call(self, name, *args):
        """The ABI function `name` on `args` (a plan's or a communicator's handle first),
        checked."""
        self.check(getattr(self._api, name)(*args))

    def function(self, name):
        """The ABI function `name` itself, for a hot loop that checks its own status."""
        return getattr(self._api, name)

    def function_address(self, name):
        """The address of the ABI function `name` (what the torch bridge calls)."""
        return ctypes.cast(getattr(self._api, name), ctypes.c_void_p).value

    def bridge_plugin(self):
        """What the torch bridge's copy() and move() take first: copy_batch's address, this
        context and its device type."""
        return self._bridge_plugin

    def stream_list(self, streams):
        """{device index: stream handle}, or a StreamArray, as a C array of qlink_stream and
        its length."""
        if isinstance(streams, StreamArray):
            return streams.pointer, streams.count
        if not streams:
            return None, 0
        words = np.empty((len(streams), 2), np.uint64)
        words[:, 0] = [(int(d) << 32) | self.device_type for d in streams]
        words[:, 1] = [h or 0 for h in streams.values()]
        return words.ctypes.data_as(ctypes.POINTER(_abi.Stream)), len(streams)  # the pointer holds `words`

    def synchronize(self, device, stream=None):
        self.invoke("stream_synchronize", int(device), stream)

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._api.context_destroy(handle)

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
