"""PyTorch's current streams as the qlink_stream arrays the plugin orders its work on, and
its current GPU where a device names none."""
import ctypes
import threading

import torch

from . import _abi

# The raw handle of a device's current stream; the private binding skips building a
# torch.cuda.Stream object per call (about 10x cheaper).
if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    raw_stream = torch._C._cuda_getCurrentRawStream
else:
    def raw_stream(device):
        return torch.cuda.current_stream(device).cuda_stream


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


_local = threading.local()


def resolved_device(device):
    """`device` as a torch.device, a GPU without an index taken as the current one (the
    device a tensor made there reports)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def streams_key(device_type, devices):
    """What identifies a device list's streams: (device type, sorted devices)."""
    return device_type, tuple(sorted(devices))


def current_streams_for(key):
    """The calling thread's current stream of each device of a streams_key, as a
    StreamArray this thread reuses for that key."""
    try:
        array = _local.arrays[key]
    except (AttributeError, KeyError):  # this thread's first call for these devices
        array = _local.__dict__.setdefault("arrays", {})[key] = StreamArray(*key)
    array.fill(map(raw_stream, array.devices))
    return array


def current_streams(ctx, devices):
    """The calling thread's current stream of each of `devices` of ctx's backend."""
    return current_streams_for(streams_key(ctx.device_type, devices))
