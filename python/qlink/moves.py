"""The Context's moves: a module's parameters and buffers, or a nested batch of tensors,
to another device (GPTQModel's move_module_to_device and move_nested_to_device)."""
import collections
import itertools
import logging
import threading

import torch

from .copy_calls import gpu_bridge
from .pinned_staging import STREAM_MIN_BYTES, PinnedStaging, stageable
from .streams import resolved_device

_staging_lock = threading.Lock()


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


PINNED_MIN_BYTES = 1 << 20  # below it, page-locking a landing costs more than it saves


def nbytes(tensors):
    """The bytes `tensors` hold together."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _to_host(tensors, land, min_bytes):
    """Copies of `tensors` in CPU memory. The contiguous GPU tensors that need no autograd
    and share no storage with another of them, when they add up to min_bytes, by
    land(those tensors); the rest by PyTorch (storage ties kept)."""
    out = list(tensors)
    storages = collections.Counter(t.untyped_storage().data_ptr() for t in tensors if t.is_cuda)
    fast = [i for i, t in enumerate(tensors) if t.is_cuda and t.is_contiguous() and not t.requires_grad
            and storages[t.untyped_storage().data_ptr()] == 1]
    if nbytes([tensors[i] for i in fast]) < min_bytes:
        fast = []
    if fast:
        for i, copy in zip(fast, land([tensors[i] for i in fast])):
            out[i] = copy
    taken = set(fast)
    _move_regular(out, tensors, [i for i, t in enumerate(tensors) if i not in taken and t.device.type != "cpu"],
                  torch.device("cpu"))
    return out


def _pinned_landing(tensors):
    """Page-locked copies of the GPU `tensors`, each copied asynchronously on its device's
    current stream, the streams waited for once at the end (PyTorch's pageable copy waits
    for each tensor, at a fraction of the link's speed)."""
    out, streams = [], {}
    for t in tensors:
        out.append(torch.empty(t.shape, dtype=t.dtype, pin_memory=True))
        out[-1].copy_(t, non_blocking=True)  # on the source device's current stream
        streams.setdefault(t.device, torch.cuda.current_stream(t.device))
    for stream in streams.values():
        stream.synchronize()  # the caller reads the copies as soon as they are returned
    return out


WARMUP_MAX_BYTES = 2 << 30  # page-locked ahead at most: a LLaMA-70B-shaped layer's landing is 1.8 GiB


def warm_pinned_host(tensors):
    """Starts a thread that makes the page-locked blocks a later _pinned_landing of tensors
    shaped like `tensors` (meta ones will do) asks for, the first WARMUP_MAX_BYTES of them,
    and frees them; returns why it did not start one, or None. PyTorch's host allocator keeps
    a freed block for the next request of its size, so that landing finds them made (page-
    locking, not the copies, is most of a first landing's time: bench/RESULTS.md). Meanwhile
    the process's other CUDA calls wait for the driver."""
    if not torch.cuda.is_available():
        return "no GPU"
    total = nbytes(tensors)
    if total < PINNED_MIN_BYTES:
        return "%d bytes would not land page-locked (PINNED_MIN_BYTES)" % total
    shapes, held = [], 0
    for t in tensors:
        size = t.numel() * t.element_size()
        if size and held + size <= WARMUP_MAX_BYTES:
            shapes.append((t.shape, t.dtype))
            held += size
    if not shapes:
        return "no tensor fits WARMUP_MAX_BYTES (%d)" % WARMUP_MAX_BYTES

    def make():
        try:
            blocks = [torch.empty(shape, dtype=dtype, pin_memory=True) for shape, dtype in shapes]
            del blocks
        except Exception as error:  # noqa: BLE001 (the landing then page-locks its own, as before)
            logging.getLogger("qlink").warning("qlink: page-locked landing blocks not made ahead (%s: %s)",
                                               type(error).__name__, error)
    threading.Thread(target=make, name="qlink-pinned-warmup", daemon=True).start()
    return None


# The walks below recurse through module-level functions: a nested function that calls
# itself is a reference cycle, which would hold the call's tensors (GPU memory) until the
# cyclic collector runs rather than until the caller lets them go.

def _collect(v, leaves):
    if isinstance(v, torch.Tensor):
        leaves.setdefault(id(v), v)
    elif isinstance(v, dict):
        for x in v.values():
            _collect(x, leaves)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _collect(x, leaves)


def nested_tensors(value):
    """The distinct tensors of `value` (dicts, lists, tuples, namedtuples), first-seen order."""
    leaves = {}
    _collect(value, leaves)
    return list(leaves.values())


def _rebuild(v, new):
    if isinstance(v, torch.Tensor):
        return new[id(v)]
    if isinstance(v, dict):
        return type(v)((k, _rebuild(x, new)) for k, x in v.items())
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return type(v)(*(_rebuild(x, new) for x in v))
    if isinstance(v, (list, tuple)):
        return type(v)(_rebuild(x, new) for x in v)
    return v


def map_nested(value, replace):
    """A copy of `value` with its distinct tensors (nested_tensors) swapped for
    replace(those tensors), in order; container types kept, anything else passed through,
    a tensor appearing twice replaced by the same one."""
    leaves = nested_tensors(value)
    return _rebuild(value, dict(zip(map(id, leaves), replace(leaves))))


def module_tensors(module):
    """The distinct parameters and the distinct buffers of `module` and its submodules,
    each list in first-seen order."""
    params, buffers = {}, {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                params.setdefault(id(p), p)
        for b in m._buffers.values():
            if b is not None:
                buffers.setdefault(id(b), b)
    return list(params.values()), list(buffers.values())


def has_meta(module):
    """Whether any parameter or buffer of `module` (its submodules' too) is on the meta
    device (offloaded, or not materialized yet)."""
    return any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers()))


class MoveCalls:
    """Moves of modules and nested batches; part of Context."""

    @property
    def pinned_staging(self):
        """This context's PinnedStaging: CPU tensors to its devices through pinned twins."""
        staging = self.__dict__.get("_host_staging")
        if staging is None:
            with _staging_lock:
                staging = self.__dict__.setdefault("_host_staging", PinnedStaging(self))
        return staging

    def move_tensors(self, tensors, device, keep_host_copies=False, pageable=False):
        """Copies of `tensors` on `device`, in order; those already there are returned as is.

        Through the torch bridge, GPU leaves that are contiguous and share no bytes with
        another leaf move in one call: one new allocation holds all but the largest, one
        copy_batch fills every destination. Contiguous host leaves (no autograd) move to a
        GPU through pinned twins (pinned_staging.py), without blocking the calling thread, or,
        a large one-time move, streamed through the staging's page-locked slots;
        keep_host_copies holds the twins for their sources' next move (data moved again
        and again). GPU leaves going to the host land in page-locked memory, copied
        asynchronously and waited for once (_pinned_landing), or, pageable and a large
        move, in pageable memory streamed back through the staging's slots (data leaving
        the GPU for good). The rest, and every leaf where the bridge is missing, move by
        PyTorch (storage ties kept)."""
        out = list(tensors)
        if not out:
            return out
        target = resolved_device(device)
        if all(t.device == target for t in out):
            return out  # the forwards' moves of a calibration cache already there (gptqmodel.input_cache)
        if target.type == "cpu" and not self.cpu_memory:
            if pageable:
                return _to_host(tensors, self.pinned_staging.to_host, STREAM_MIN_BYTES)
            return _to_host(tensors, _pinned_landing, PINNED_MIN_BYTES)
        if target.type != "cuda":
            for i, t in enumerate(tensors):
                if t.device != target:
                    out[i] = t.to(target)
            return out
        if target.index >= torch.cuda.device_count():
            raise ValueError("device %s does not exist: PyTorch sees %d GPU(s)" % (target, torch.cuda.device_count()))
        bridge = gpu_bridge(self)
        if bridge is None:
            moved = [t if t.device == target else None for t in tensors]
        else:
            status, moved = bridge.move(*self.bridge_plugin(), out, target.index)
            if status:
                self.check(status)
        host = [i for i, m in enumerate(moved) if m is None and stageable(tensors[i]) is None]
        if host and not self.cpu_memory:
            staged = self.pinned_staging.to_device([tensors[i] for i in host], target, keep=keep_host_copies)
            for i, t in zip(host, staged):
                moved[i] = t
        _move_regular(moved, tensors, [i for i, m in enumerate(moved) if m is None], target)
        return moved

    def move_module_to_device(self, module, device, pageable=False):
        """module.to(device) for parameters and buffers, through qlink: parameters keep their
        identity (param.data is replaced, as module.to does), tied parameters stay tied.
        pageable: to the CPU, as move_tensors says."""
        params, buffers = module_tensors(module)
        sources = [p.detach() for p in params] + buffers  # the parameters' data: autograd records no move
        moved = self.move_tensors(sources, device, pageable=pageable)
        with torch.no_grad():
            for p, source, new in zip(params, sources, moved):
                if new is not source:
                    p.data = new
                if p.grad is not None:
                    p.grad.data = p.grad.data.to(device)
        new_buffers = {id(b): new for b, new in zip(buffers, moved[len(params):])}
        for m in module.modules():
            for name, b in m._buffers.items():
                if b is not None:
                    m._buffers[name] = new_buffers[id(b)]
        return module

    def move_nested_to_device(self, value, device, keep_host_copies=False):
        """A copy of `value` (dicts, lists, tuples, namedtuples of tensors; anything else
        passed through) with every tensor on `device`; container types are kept, a tensor
        appearing twice is moved once. keep_host_copies: as for move_tensors."""
        return map_nested(value, lambda leaves: self.move_tensors(leaves, device, keep_host_copies))
