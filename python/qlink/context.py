"""A loaded plugin and one qlink context: devices, peer topology, copies."""
import ctypes
import dataclasses
import os
import sys
import threading

import numpy as np

from . import _abi, _bridge
from ._dlpack import TensorArray, pack
from .config import to_json
from .errors import VersionMismatchError, error_for

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


def _grant_torch_segments(pairs):
    """Lets each enabled pair's reader map PyTorch's memory of the other device.

    Peer access enabled through the runtime does not reach memory PyTorch's caching
    allocator maps itself (expandable_segments: cuMemCreate + cuMemMap): a kernel reading
    it over the link faults. PyTorch grants a device its peer's segments the first time
    it copies between the two, so a tiny copy each way per pair does it."""
    torch = sys.modules.get("torch")
    if torch is None or not pairs or not torch.cuda.is_available():
        return
    for a, b in {tuple(sorted(p)) for p in pairs}:
        if max(a, b) < torch.cuda.device_count():
            x, y = torch.empty(1, device="cuda:%d" % a), torch.empty(1, device="cuda:%d" % b)
            x.copy_(y)
            y.copy_(x)


@dataclasses.dataclass(frozen=True)
class PeerStatus:
    src: int
    dst: int
    state: str           # one of _abi.PEER_STATES
    probed: bool
    peer_gbps: float
    regular_gbps: float
    reason: str

    @property
    def enabled(self):
        return self.state == "enabled"


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    total_bytes: int
    free_bytes: int


class Context:
    """One qlink_context. Every method may be called from many threads at once."""

    def __init__(self, config=None, library=None):
        self._lib, self._api = _negotiate(library or default_library_path())
        handle = ctypes.c_void_p()
        self._check(self._api.context_create(to_json(config).encode(), ctypes.byref(handle)))
        self._handle = handle
        name = ctypes.c_char_p()
        self._check(self._api.backend_name(self._handle, ctypes.byref(name)))
        self.backend = name.value.decode()
        count = ctypes.c_int32()
        self._check(self._api.device_count(self._handle, ctypes.byref(count)))
        self.device_count = count.value
        self._device_type = {"cpu": _abi.KDL_CPU, "cuda": _abi.KDL_CUDA, "hip": _abi.KDL_ROCM}.get(
            self.backend, _abi.KDL_CPU)
        # Addresses the torch bridge calls the plugin through.
        self._copy_batch_fn = ctypes.cast(self._api.copy_batch, ctypes.c_void_p).value
        self._copy_plan_execute_fn = ctypes.cast(self._api.copy_plan_execute, ctypes.c_void_p).value
        self._all_reduce_plan_execute_fn = ctypes.cast(self._api.all_reduce_plan_execute, ctypes.c_void_p).value

    def _bridge_plugin(self):
        """What the torch bridge's copy() and move() take first: copy_batch's address, this
        context and its device type."""
        return self._copy_batch_fn, self._handle.value, self._device_type

    def _check(self, status):
        if status != _abi.OK:
            raise error_for(status, self._api.last_error().decode())

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._api.context_destroy(handle)

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def devices(self):
        out = []
        for d in range(self.device_count):
            info = _abi.DeviceInfo(struct_size=ctypes.sizeof(_abi.DeviceInfo))
            self._check(self._api.device_info(self._handle, d, ctypes.byref(info)))
            out.append(DeviceInfo(d, info.name.decode(), info.total_bytes, info.free_bytes))
        return out

    def enable_peer_access(self, devices=None):
        """Enables (and per config probes) every ordered pair of `devices` (all by default);
        returns the peer matrix of those devices."""
        devices = list(range(self.device_count)) if devices is None else [int(d) for d in devices]
        array = (ctypes.c_int32 * max(len(devices), 1))(*devices)
        self._check(self._api.enable_peer_access(self._handle, array, len(devices)))
        matrix = self.peer_matrix(devices)
        _grant_torch_segments([(s, d) for (s, d), st in matrix.items() if st.enabled])
        return matrix

    def peer_info(self, src, dst):
        info = _abi.PeerInfo(struct_size=ctypes.sizeof(_abi.PeerInfo))
        self._check(self._api.peer_info(self._handle, int(src), int(dst), ctypes.byref(info)))
        return PeerStatus(info.src_device, info.dst_device, _abi.PEER_STATES[info.state], bool(info.probed),
                          info.peer_gbps, info.regular_gbps, info.reason.decode())

    def peer_matrix(self, devices=None):
        devices = range(self.device_count) if devices is None else devices
        return {(s, d): self.peer_info(s, d) for s in devices for d in devices if s != d}

    def can_copy(self, src, dst):
        """Whether src -> dst takes the direct peer path."""
        return self.peer_info(src, dst).enabled

    def measure_link(self, src, dst, nbytes=32 << 20):
        m = _abi.LinkMeasurement(struct_size=ctypes.sizeof(_abi.LinkMeasurement))
        self._check(self._api.measure_link(self._handle, int(src), int(dst), int(nbytes), ctypes.byref(m)))
        return {"bytes": m.bytes, "gbps": m.gbps, "latency_us": m.latency_us, "used_peer": bool(m.used_peer)}

    def _pack_pair(self, sources, targets, source_devices, target_devices):
        if len(sources) != len(targets):
            raise ValueError("sources has %d leaves but targets has %d" % (len(sources), len(targets)))
        return pack(sources, source_devices), pack(targets, target_devices)

    def _copy_args(self, src, dst, streams, sources_ready, sources_held, wait):
        """qlink_copy_args over packed leaves; streams, promises and wait as for copy()."""
        return _abi.CopyArgs(ctypes.sizeof(_abi.CopyArgs), src.pointer, dst.pointer, src.count,
                             *self._streams(streams), _abi.copy_flags(sources_ready, sources_held, wait))

    def copy(self, sources, targets, source_devices=None, target_devices=None, streams=None, sources_ready=False,
             sources_held=False, wait=False):
        """Enqueues sources[i] -> targets[i] for every leaf (see qlink_copy_args).

        streams: {device index: vendor stream handle}; devices not listed use their
        default stream. *_devices override the tensors' device indices (CPU virtual devices).
        sources_ready: the sources' producers are already ordered before the destination
        streams (no wait on the source streams). sources_held: the caller keeps the sources
        alive and unmodified until the copy completes (the source streams do not wait).
        wait: return once the destinations hold the data (a blocking copy)."""
        src, dst = self._pack_pair(sources, targets, source_devices, target_devices)
        self.copy_packed(src, dst, streams, sources_ready, sources_held, wait)

    def copy_packed(self, src, dst, streams=None, sources_ready=False, sources_held=False, wait=False):
        """copy() of leaves already packed (qlink._dlpack.pack)."""
        args = self._copy_args(src, dst, streams, sources_ready, sources_held, wait)
        self._check(self._api.copy_batch(self._handle, ctypes.byref(args)))

    def prepare(self, sources, targets, source_devices=None, target_devices=None, sources_ready=False,
                sources_held=False, wait=False):
        """A CopyPlan: validated and planned once, replayed with run(); promises and wait as
        for copy()."""
        src, dst = self._pack_pair(sources, targets, source_devices, target_devices)
        args = self._copy_args(src, dst, None, sources_ready, sources_held, wait)
        plan = ctypes.c_void_p()
        self._check(self._api.copy_plan_create(self._handle, ctypes.byref(args), ctypes.byref(plan)))
        # With both promises the source streams take no part: only the destinations' are read.
        stream_devices = dst.devices if sources_ready and sources_held else src.devices | dst.devices
        return CopyPlan(self, plan, list(sources), list(targets), stream_devices)

    def _streams(self, streams):
        """{device index: stream handle}, or a StreamArray, as a C array of qlink_stream and
        its length."""
        if isinstance(streams, StreamArray):
            return streams.pointer, streams.count
        if not streams:
            return None, 0
        words = np.empty((len(streams), 2), np.uint64)
        words[:, 0] = [(int(d) << 32) | self._device_type for d in streams]
        words[:, 1] = [h or 0 for h in streams.values()]
        return words.ctypes.data_as(ctypes.POINTER(_abi.Stream)), len(streams)  # the pointer holds `words`

    def synchronize(self, device, stream=None):
        self._check(self._api.stream_synchronize(self._handle, int(device), stream))

    def hessian_accumulate(self, inputs, partials, input_devices=None, partial_devices=None, streams=None):
        """partials[d] += X^T X (fp32, both triangles) for every input X (..., columns) on
        partial d's device (qlink_hessian_args); stream-ordered, like a copy. *_devices:
        qlink device ids where the tensors do not say (the CPU backend's virtual devices)."""
        src, dst = TensorArray(inputs, input_devices), TensorArray(partials, partial_devices)
        args = _abi.HessianArgs(ctypes.sizeof(_abi.HessianArgs), ctypes.addressof(src.array), len(inputs),
                                ctypes.addressof(dst.array), len(partials), *self._streams(streams))
        self._check(self._api.hessian_accumulate(self._handle, ctypes.byref(args)))

    _GPTQ_TENSORS = ("weight", "hessian", "codes", "scales", "zeros", "g_idx", "dequantized")

    def gptq_quantize(self, layers, options, devices=None, streams=None):
        """Quantizes layers (qlink_gptq_args): each a dict of the _GPTQ_TENSORS (outputs may be
        None), an optional "name" and "device" (qlink device id where the tensors do not say);
        options: the qlink_gptq_options fields by name. devices: where the solve may run (None:
        each layer on its own device). Writes the outputs; returns (loss, damp) per layer."""
        tensors, ids, where = [], [], []
        for layer in layers:
            for field in self._GPTQ_TENSORS:
                t = layer.get(field)
                where.append(None if t is None else len(tensors))
                if t is not None:
                    tensors.append(t)
                    ids.append(layer.get("device", t.device.index or 0))
        array = TensorArray(tensors, ids)
        base, size = ctypes.addressof(array.array), ctypes.sizeof(_abi.DLTensor)
        specs = (_abi.GptqLayer * max(len(layers), 1))()
        names = [str(layer.get("name") or "").encode() for layer in layers]
        for i, spec in enumerate(specs[:len(layers)]):
            spec.struct_size = ctypes.sizeof(_abi.GptqLayer)
            spec.name = names[i] or None
            for j, field in enumerate(self._GPTQ_TENSORS):
                k = where[i * len(self._GPTQ_TENSORS) + j]
                setattr(spec, field, None if k is None else base + k * size)
        o = _abi.GptqOptions(ctypes.sizeof(_abi.GptqOptions), **options)
        device_list = [int(d) for d in devices or []]
        device_array = (ctypes.c_int32 * max(len(device_list), 1))(*device_list)
        args = _abi.GptqArgs(ctypes.sizeof(_abi.GptqArgs), ctypes.pointer(o), specs, len(layers),
                             device_array if device_list else None, len(device_list), *self._streams(streams))
        self._check(self._api.gptq_quantize(self._handle, ctypes.byref(args)))
        return [(spec.loss, spec.damp) for spec in specs[:len(layers)]]


class StreamArray:
    """qlink_stream entries for a fixed list of devices, refilled in place before each call
    (a hot path pays a few attribute writes instead of building an array)."""

    def __init__(self, device_type, devices):
        self.devices = list(devices)
        self.count = len(self.devices)
        self._array = (_abi.Stream * max(self.count, 1))()
        for entry, d in zip(self._array, self.devices):
            entry.device.device_type, entry.device.device_id = device_type, d
        self._entries = list(self._array)[:self.count]
        self.pointer = ctypes.cast(self._array, ctypes.POINTER(_abi.Stream))

    def fill(self, handles):
        for entry, handle in zip(self._entries, handles):
            entry.stream = handle


class CopyPlan:
    """A prepared batch over fixed memory; holds its tensors so they outlive the plan."""

    def __init__(self, ctx, handle, sources, targets, stream_devices):
        self._ctx, self._handle = ctx, handle
        self.sources, self.targets = sources, targets
        self.stream_devices = stream_devices  # the devices whose streams a run orders against

    def run(self, streams=None):
        array, n = self._ctx._streams(streams)
        self._ctx._check(self._ctx._api.copy_plan_execute(self._handle, array, n))

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and self._ctx._handle:
            self._ctx._api.copy_plan_destroy(handle)

    __del__ = close
