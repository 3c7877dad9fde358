"""GPTQModel-shaped peer copies (HOSTS.md): peer_copy_batch, move_module_to_device,
move_nested_to_device, and prepared batches for repeated moves.

Ordering: every copy waits for the work already on the source device's current stream
and is enqueued on the destination device's current stream, so anything PyTorch runs
there next sees the data; later work on the source's current stream waits for the copy,
so the caching allocator, which reuses a freed source in that stream's order, cannot hand
it out while it is still being read (no record_stream per leaf). Nothing blocks the host.

Only GPU-to-GPU leaves go through qlink; host tensors take PyTorch's regular path (P2P is
an accelerator concept)."""
import collections
import threading

import torch

from . import _abi, _bridge
from ._dlpack import pack
from .context import Context, StreamArray

_default = None
_default_lock = threading.Lock()

# The raw handle of a device's current stream; the private binding skips building a
# torch.cuda.Stream object per call (about 10x cheaper).
if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _raw_stream = torch._C._cuda_getCurrentRawStream
else:
    def _raw_stream(device):
        return torch.cuda.current_stream(device).cuda_stream


def configure(config=None, library=None):
    """Installs the process-wide context the functions below use by default."""
    global _default
    ctx = Context(config, library)
    with _default_lock:
        _default = ctx
    return ctx


def default_context():
    global _default
    with _default_lock:
        if _default is None:
            _default = Context()
        return _default


_local = threading.local()


def current_streams(ctx, devices):
    """The calling thread's current stream of each device, as a StreamArray reused by this
    thread for that device list."""
    return _current_streams(_streams_key(ctx, devices))


def _streams_key(ctx, devices):
    """What identifies a device list's streams: (device type, sorted devices)."""
    return ctx._device_type, tuple(sorted(devices))


def _current_streams(key):
    """current_streams for a _streams_key."""
    try:
        array = _local.arrays[key]
    except (AttributeError, KeyError):  # this thread's first call for these devices
        array = _local.__dict__.setdefault("arrays", {})[key] = StreamArray(*key)
    array.fill(map(_raw_stream, array.devices))
    return array


def _gpu_bridge(ctx):
    """The torch bridge for ctx's copies, or None: on a host-memory backend there are no
    PyTorch GPU streams to order against, and the bridge may be missing."""
    return _bridge.gpu() if ctx._device_type != _abi.KDL_CPU else None


def _bridged_replay(ctx, execute, handle, streams_key):
    """A prepared plan's run() through the torch bridge, which reads the current streams
    and calls `execute` (a plan execute's address) on `handle` in C, no Python per device;
    None without the bridge. streams_key: the devices', from _streams_key."""
    bridge = _gpu_bridge(ctx)
    if bridge is None:
        return None
    run_plan, check = bridge.run, ctx._check
    device_type, devices = streams_key

    def run():
        status = run_plan(execute, handle, device_type, devices)
        if status:
            check(status)
    return run


def _enqueue(ctx, src, dst):
    """One copy_batch of packed leaves on the current streams of every device involved."""
    ctx.copy_packed(src, dst, current_streams(ctx, src.devices | dst.devices))


def peer_copy_batch(sources, targets, ctx=None):
    """targets[i].copy_(sources[i]) for every leaf, GPU leaves in as few launches as the
    plugin can (one per destination device for small leaves). Byte-exact: shapes and
    dtypes may differ as long as byte sizes match."""
    if len(sources) != len(targets):
        raise ValueError("sources has %d leaves but targets has %d" % (len(sources), len(targets)))
    if not sources:
        return
    ctx = ctx or default_context()
    bridge = _gpu_bridge(ctx)
    if bridge is not None:
        try:
            status = bridge.copy(*ctx._bridge_plugin(), sources, targets)
        except TypeError:
            status = None  # a leaf that is not a tensor: pack() names it
        if status is not None:  # None: host or non-contiguous leaves, for the general path below
            if status:
                ctx._check(status)
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
    _enqueue(ctx, src, dst)


class PreparedCopy:
    """A batch validated and planned once, replayed with run() (replica mirrors,
    calibration staging). Holds its tensors so they outlive the plan.

    Each run() is ordered like peer_copy_batch unless the caller takes part of it over:
    sources_held=True when the sources stay unmodified until the copy has completed (frozen
    weights mirrored again and again): later work on the source devices then does not wait
    for the copy; sources_ready=True when their producers are already ordered before the
    destination streams. wait=True: each run() returns once the targets hold the data."""

    def __init__(self, sources, targets, ctx=None, sources_ready=False, sources_held=False, wait=False):
        self._ctx = ctx or default_context()
        self._plan = self._ctx.prepare(sources, targets, sources_ready=sources_ready, sources_held=sources_held,
                                       wait=wait)
        self._execute = self._ctx._api.copy_plan_execute
        self._handle = self._plan._handle
        self._streams_key = _streams_key(self._ctx, self._plan.stream_devices)
        bridged = _bridged_replay(self._ctx, self._ctx._copy_plan_execute_fn, self._handle.value, self._streams_key)
        if bridged is not None:
            self.run = bridged

    def run(self):
        streams = _current_streams(self._streams_key)
        status = self._execute(self._handle, streams.pointer, streams.count)
        if status:
            self._ctx._check(status)


def _move_storage(t, device, moved):
    """`t` moved with its whole storage, so tensors sharing that storage keep sharing it
    (and non-contiguous layouts arrive as they were)."""
    storage = t.untyped_storage()
    key = storage.data_ptr()
    if key not in moved:
        whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        moved[key] = whole.to(device).untyped_storage()
    return torch.empty(0, dtype=t.dtype, device=device).set_(moved[key], t.storage_offset(), t.size(), t.stride())


def _move_regular(out, tensors, indices, target):
    """out[i] = tensors[i] moved by PyTorch for i in indices: alone as Tensor.to moves it,
    or, where several of them share a storage, with that storage whole, so they keep
    sharing it."""
    storages = {i: tensors[i].untyped_storage().data_ptr() for i in indices if tensors[i].is_cuda}
    users = collections.Counter(storages.values())
    moved = {}
    for i in indices:
        t = tensors[i]
        out[i] = _move_storage(t, target, moved) if users[storages.get(i)] > 1 else t.to(target)


def _move_tensors(tensors, device, ctx):
    """Copies of `tensors` on `device`, in order; those already there are returned as is.

    Through the bridge, GPU leaves that are contiguous and share no bytes with another
    leaf move in one call: one new allocation holds all but the largest, one copy_batch
    fills every destination. The rest, and every leaf where the bridge is missing, move
    by PyTorch (storage ties kept)."""
    out = list(tensors)
    if not out:
        return out
    target = torch.device(device)
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    if target.type != "cuda":
        for i, t in enumerate(tensors):
            if t.device != target:
                out[i] = t.to(target)
        return out
    if target.index >= torch.cuda.device_count():
        raise ValueError("device %s does not exist: PyTorch sees %d GPU(s)" % (target, torch.cuda.device_count()))
    ctx = ctx or default_context()
    bridge = _gpu_bridge(ctx)
    if bridge is None:
        _move_regular(out, tensors, [i for i, t in enumerate(tensors) if t.device != target], target)
        return out
    status, moved = bridge.move(*ctx._bridge_plugin(), out, target.index)
    if status:
        ctx._check(status)
    _move_regular(moved, tensors, [i for i, m in enumerate(moved) if m is None], target)
    return moved


def move_module_to_device(module, device, ctx=None):
    """module.to(device) for parameters and buffers, through qlink: parameters keep their
    identity (param.data is replaced, as module.to does), tied parameters stay tied."""
    params, buffers = {}, {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                params.setdefault(id(p), p)
        for b in m._buffers.values():
            if b is not None:
                buffers.setdefault(id(b), b)
    params, buffers = list(params.values()), list(buffers.values())
    moved = _move_tensors(params + buffers, device, ctx)
    with torch.no_grad():
        for p, new in zip(params, moved):
            if new is not p:
                p.data = new
            if p.grad is not None:
                p.grad.data = p.grad.data.to(device)
    new_buffers = {id(b): new for b, new in zip(buffers, moved[len(params):])}
    for m in module.modules():
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = new_buffers[id(b)]
    return module


def move_nested_to_device(value, device, ctx=None):
    """A copy of `value` (dicts, lists, tuples, namedtuples of tensors; anything else passed
    through) with every tensor on `device`; container types are kept, a tensor appearing
    twice is moved once."""
    leaves = {}

    def collect(v):
        if isinstance(v, torch.Tensor):
            leaves.setdefault(id(v), v)
        elif isinstance(v, dict):
            for x in v.values():
                collect(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)

    collect(value)
    moved = dict(zip(leaves.keys(), _move_tensors(list(leaves.values()), device, ctx)))

    def rebuild(v):
        if isinstance(v, torch.Tensor):
            return moved[id(v)]
        if isinstance(v, dict):
            return type(v)((k, rebuild(x)) for k, x in v.items())
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return type(v)(*(rebuild(x) for x in v))
        if isinstance(v, (list, tuple)):
            return type(v)(rebuild(x) for x in v)
        return v

    return rebuild(value)
