"""GPTQModel-shaped peer copies (HOSTS.md): peer_copy_batch, move_module_to_device,
move_nested_to_device, and prepared batches for repeated moves.

Ordering: every copy waits for the work already on the source device's current stream
and is enqueued on the destination device's current stream, so anything PyTorch runs
there next sees the data; later work on the source's current stream waits for the copy,
so the caching allocator, which reuses a freed source in that stream's order, cannot hand
it out while it is still being read (no record_stream per leaf). Nothing blocks the host.

Only GPU-to-GPU leaves go through qlink; host tensors take PyTorch's regular path (P2P is
an accelerator concept)."""
import itertools
import threading

import numpy as np
import torch

from ._dlpack import (_DATA_PTR, _GET_DEVICE, _GPU_TYPE, _IS_CONTIGUOUS, _NBYTES, byte_runs, byte_vectors,
                      device_type_of, pack)
from .context import Context, StreamArray

_default = None
_default_lock = threading.Lock()
_ALIGN = 256  # bytes: leaves packed into one destination allocation start on this boundary
_FEW = 8  # leaves up to which a move is planned in plain Python
_OWN = 8 << 20  # bytes from which a moved leaf gets an allocation of its own: it copies for
                # longer than allocating takes, and frees its memory on its own

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
    return _current_streams((ctx._device_type, tuple(sorted(devices))))


def _current_streams(key):
    """current_streams for a (device type, sorted devices) key."""
    try:
        array = _local.arrays[key]
    except (AttributeError, KeyError):  # this thread's first call for these devices
        array = _local.__dict__.setdefault("arrays", {})[key] = StreamArray(*key)
    array.fill(map(_raw_stream, array.devices))
    return array


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
    src, dst = pack(sources), pack(targets)
    if src.host or dst.host:
        gpu = [(s, t) for s, t in zip(sources, targets) if s.is_cuda and t.is_cuda]
        for s, t in zip(sources, targets):
            if not (s.is_cuda and t.is_cuda):
                t.copy_(s)  # the regular path: host leaves
        if not gpu:
            return
        src, dst = pack([s for s, _ in gpu]), pack([t for _, t in gpu])
    _enqueue(ctx or default_context(), src, dst)


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
        self._streams_key = (self._ctx._device_type, tuple(sorted(self._plan.stream_devices)))

    def run(self):
        streams = _current_streams(self._streams_key)
        status = self._execute(self._handle, streams.pointer, streams.count)
        if status:
            self._ctx._check(status)


def _overlapping(ptrs, nbytes):
    """Leaves whose bytes overlap another leaf's (tied through a shared storage), or None
    when no two do (the common case, settled by one sort)."""
    order = np.argsort(ptrs, kind="stable")
    start = ptrs[order].astype(np.int64)
    end = start + nbytes[order]
    if (start[1:] >= end[:-1]).all():
        return None
    first_of_cluster = np.ones(len(ptrs), bool)
    first_of_cluster[1:] = start[1:] >= np.maximum.accumulate(end)[:-1]
    cluster = np.cumsum(first_of_cluster)
    out = np.empty(len(ptrs), bool)
    out[order] = np.bincount(cluster)[cluster] > 1
    return out


def _move_storage(t, device, moved):
    """The regular path: `t` moved with its whole storage, so tensors sharing that storage
    keep sharing it (and non-contiguous layouts arrive as they were)."""
    storage = t.untyped_storage()
    key = storage.data_ptr()
    if key not in moved:
        whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        moved[key] = whole.to(device).untyped_storage()
    return torch.empty(0, dtype=t.dtype, device=device).set_(moved[key], t.storage_offset(), t.size(), t.stride())


def _runs(tensors, indices, data_only):
    """indices as runs of leaves to view at once, [((dtype, shape, strides), members)]: the
    leaves below data_only (parameters: their views only feed .data) that share dtype,
    shape and strides form one run; every other leaf is a run of its own (a view handed out
    must not come from a multi-output op, which forbids in-place autograd on it)."""
    runs, shared = [], {}
    for i in indices:
        t = tensors[i]
        key = (t.dtype, t.shape, t.stride())
        if i >= data_only:
            runs.append((key, [i]))
            continue
        run = shared.get(key)
        if run is None:
            run = shared[key] = (key, [])
            runs.append(run)
        run[1].append(i)
    return runs


def _place_views(out, runs, flat, offsets):
    """out[i] for every leaf of `runs`: the bytes of `flat` at its offset (offsets: bytes,
    one per leaf in run order) viewed with its dtype, shape and strides. A run's leaves lie
    evenly spaced, so one unbind views them all (half the cost of a view each)."""
    typed = {}
    k = 0
    for (dtype, shape, stride), members in runs:
        view = typed.get(dtype)
        if view is None:
            view = typed[dtype] = flat.view(dtype)
        size = view.element_size()
        if len(members) == 1:
            out[members[0]] = view.as_strided(shape, stride, offsets[k] // size)
        else:
            step = (offsets[k + 1] - offsets[k]) // size
            block = view.as_strided((len(members),) + tuple(shape), (step,) + stride, offsets[k] // size)
            for i, v in zip(members, block.unbind(0)):
                out[i] = v
        k += len(members)


def _destinations(out, tensors, fast, sizes, target, data_only):
    """Where the fast leaves (indices `fast`, byte sizes `sizes[i]`) land on `target`:
    leaves of _OWN bytes and more in allocations of their own (out[i] set here), the rest
    in one allocation laid out run by run (see _runs). Returns the leaves in copy order,
    their destination addresses, and place(), which sets out[i] to the views into the
    shared allocation (call it once the copy is enqueued: it runs meanwhile)."""
    own = [i for i in fast if sizes[i] >= _OWN]
    for i in own:
        out[i] = torch.empty_like(tensors[i], device=target)
    runs = _runs(tensors, [i for i in fast if sizes[i] < _OWN], data_only)
    order = [i for _, members in runs for i in members]
    offsets = list(itertools.accumulate(((sizes[i] + _ALIGN - 1) // _ALIGN * _ALIGN for i in order), initial=0))
    flat = torch.empty(offsets.pop(), dtype=torch.uint8, device=target) if order else None
    addresses = ([flat.data_ptr() + off for off in offsets] if order else []) + [out[i].data_ptr() for i in own]

    def place():
        if flat is not None:
            _place_views(out, runs, flat, offsets)
    return order + own, addresses, place


def _move_regular(out, tensors, indices, target):
    """out[i] = tensors[i] moved by PyTorch, keeping storage ties, for i in indices."""
    moved = {}
    for i in indices:
        t = tensors[i]
        out[i] = _move_storage(t, target, moved) if t.is_cuda else t.to(target)


def _move_few(tensors, target, ctx, data_only):
    """_move_tensors for a handful of leaves, in plain Python: numpy's fixed costs would
    outweigh the per-leaf work."""
    out = list(tensors)
    devices = [t.get_device() for t in tensors]  # -1: host
    spans = [(t.data_ptr(), t.data_ptr() + _NBYTES(t)) if d >= 0 else None for t, d in zip(tensors, devices)]
    fast = []
    for i, t in enumerate(tensors):
        s = spans[i]
        if (devices[i] == target.index or s is None or s[0] == s[1] or not t.is_contiguous()
                or any(o is not None and j != i and o[0] < s[1] and s[0] < o[1] for j, o in enumerate(spans))):
            continue  # already there, host, empty, non-contiguous or tied: the regular path below
        fast.append(i)
    if fast:
        sizes = [s[1] - s[0] if s is not None else 0 for s in spans]
        order, addresses, place = _destinations(out, tensors, fast, sizes, target, data_only)
        copied = [sizes[i] for i in order]
        _enqueue(ctx or default_context(),
                 byte_runs([spans[i][0] for i in order], copied, _GPU_TYPE, [devices[i] for i in order]),
                 byte_runs(addresses, copied, _GPU_TYPE, [target.index] * len(order)))
        place()
    chosen = set(fast)
    _move_regular(out, tensors, [i for i in range(len(tensors)) if i not in chosen and devices[i] != target.index],
                  target)
    return out


def _move_tensors(tensors, device, ctx, data_only=0):
    """Copies of `tensors` on `device`, in order; those already there are returned as is.
    The first data_only copies only serve as .data of parameters (see _runs).

    The fast path takes GPU leaves that are contiguous and overlap no other leaf: one
    destination allocation holds all but the largest, one copy_batch fills every
    destination, and the per-leaf views are built while the copy runs."""
    n = len(tensors)
    out = list(tensors)
    if n == 0:
        return out
    target = torch.device(device)
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    if target.type == "cuda" and n <= _FEW:
        return _move_few(tensors, target, ctx, data_only)
    ids = np.fromiter(map(_GET_DEVICE, tensors), np.int32, n)
    target_id = target.index if target.type == "cuda" else -1
    move = ids != target_id
    if target.type != "cuda":
        for i in np.nonzero(move)[0]:
            out[i] = tensors[i].to(target)
        return out
    ptrs = np.fromiter(map(_DATA_PTR, tensors), np.uint64, n)
    nbytes = np.fromiter(map(_NBYTES, tensors), np.int64, n)
    fast = move & (ids >= 0) & np.fromiter(map(_IS_CONTIGUOUS, tensors), bool, n) & (nbytes > 0)
    tied = _overlapping(ptrs, nbytes)
    if tied is not None:
        fast &= ~tied
    idx = np.nonzero(fast)[0]
    if len(idx):
        order, addresses, place = _destinations(out, tensors, idx.tolist(), nbytes.tolist(), target, data_only)
        order = np.array(order, np.int64)
        copied, dev_type = nbytes[order], device_type_of(target)
        _enqueue(ctx or default_context(), byte_vectors(ptrs[order], copied, dev_type, ids[order]),
                 byte_vectors(np.array(addresses, np.uint64), copied, dev_type, target_id))
        place()
    _move_regular(out, tensors, np.nonzero(move & ~fast)[0].tolist(), target)
    return out


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
    moved = _move_tensors(params + buffers, device, ctx, data_only=len(params))
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
