"""The Context's copies: batches of leaves (copy, peer_copy_batch) and plans validated
once and replayed on explicit streams (CopyPlan); copies.py replays them on the current
streams (PreparedCopy).

Ordering: every copy waits for the work already on the source device's current stream
and is enqueued on the destination device's current stream, so anything PyTorch runs
there next sees the data; later work on the source's current stream waits for the copy,
so the caching allocator, which reuses a freed source in that stream's order, cannot hand
it out while it is still being read (no record_stream per leaf). Nothing blocks the host.

Only GPU-to-GPU leaves go through the plugin in peer_copy_batch; CPU tensors take
PyTorch's regular path (P2P is an accelerator concept)."""
import ctypes

from . import _abi, _bridge
from ._dlpack import pack
from .streams import current_streams


def gpu_bridge(ctx):
    """The torch bridge for ctx's copies, or None: on a host-memory backend there are no
    PyTorch GPU streams to order against, and the bridge may be missing."""
    return None if ctx.cpu_memory else _bridge.gpu()


def bridged_replay(ctx, execute, handle, key):
    """A prepared plan's run() through the torch bridge, which reads the current streams
    and calls `execute` (a plan execute's address) on `handle` in C, no Python per device;
    None without the bridge. key: the devices' streams_key."""
    bridge = gpu_bridge(ctx)
    if bridge is None:
        return None
    run_plan, check = bridge.run, ctx.check
    device_type, devices = key

    def run():
        status = run_plan(execute, handle, device_type, devices)
        if status:
            check(status)
    return run


class CopyCalls:
    """Batches of copies; part of Context."""

    def _pack_pair(self, sources, targets, source_devices, target_devices):
        if len(sources) != len(targets):
            raise ValueError("sources has %d leaves but targets has %d" % (len(sources), len(targets)))
        return pack(sources, source_devices), pack(targets, target_devices)

    def _copy_args(self, src, dst, streams, sources_ready, sources_held, wait):
        """qlink_copy_args over packed leaves; streams, promises and wait as for copy()."""
        return _abi.CopyArgs(ctypes.sizeof(_abi.CopyArgs), src.pointer, dst.pointer, src.count,
                             *self.stream_list(streams), _abi.copy_flags(sources_ready, sources_held, wait))

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
        self.invoke("copy_batch", ctypes.byref(args))

    def prepare(self, sources, targets, source_devices=None, target_devices=None, sources_ready=False,
                sources_held=False, wait=False):
        """A CopyPlan: validated and planned once, replayed with run(streams); promises and
        wait as for copy()."""
        src, dst = self._pack_pair(sources, targets, source_devices, target_devices)
        args = self._copy_args(src, dst, None, sources_ready, sources_held, wait)
        plan = ctypes.c_void_p()
        self.invoke("copy_plan_create", ctypes.byref(args), ctypes.byref(plan))
        # With both promises the source streams take no part: only the destinations' are read.
        stream_devices = dst.devices if sources_ready and sources_held else src.devices | dst.devices
        return CopyPlan(self, plan, list(sources), list(targets), stream_devices)

    def peer_copy_batch(self, sources, targets):
        """targets[i].copy_(sources[i]) for every leaf on the current streams, GPU leaves in
        as few launches as the plugin can (one per destination device for small leaves).
        Byte-exact: shapes and dtypes may differ as long as byte sizes match."""
        if len(sources) != len(targets):
            raise ValueError("sources has %d leaves but targets has %d" % (len(sources), len(targets)))
        if not sources:
            return
        bridge = gpu_bridge(self)
        if bridge is not None:
            try:
                status = bridge.copy(*self.bridge_plugin(), sources, targets)
            except TypeError:
                status = None  # a leaf that is not a tensor: pack() names it
            if status is not None:  # None: host or non-contiguous leaves, for the general path below
                if status:
                    self.check(status)
                return
        src, dst = pack(sources), pack(targets)
        if src.host or dst.host:
            gpu = [(s, t) for s, t in zip(sources, targets) if s.is_cuda and t.is_cuda]
            for s, t in zip(sources, targets):
                if not (s.is_cuda and t.is_cuda):
                    t.copy_(s)  # the regular path: host leaves
            if not gpu:
                return
            src, dst = pack([s for s, _ in gpu]), pack([t for _, t in gpu])
        self.copy_packed(src, dst, current_streams(self, src.devices | dst.devices))


class CopyPlan:
    """A prepared batch over fixed memory, run on explicit streams; holds its tensors so
    they outlive the plan."""

    def __init__(self, ctx, handle, sources, targets, stream_devices):
        self._ctx, self._handle = ctx, handle
        self.sources, self.targets = sources, targets
        self.stream_devices = stream_devices  # the devices whose streams a run orders against

    def run(self, streams=None):
        self._ctx.call("copy_plan_execute", self._handle, *self._ctx.stream_list(streams))

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and not self._ctx.closed:
            self._ctx.function("copy_plan_destroy")(handle)

    __del__ = close
