"""Host tensors to a device through pinned memory: the Context's host staging.

A copy from pageable CPU memory blocks the calling thread and runs at a fraction of the
link's speed (the runtime stages it through its own pinned buffer, chunk by chunk). Here
each host source gets a pinned twin (its bytes copied once by the CPU), and the device copy
is one qlink copy_batch from the twins, enqueued on the device's current stream: the
host's next kernels on that stream see the data, the calling thread does not wait.

A twin is kept while its source lives and is unchanged (keep=True: GPTQModel's
calibration cache, moved to the device again for every subset of every layer), so the
next move of the same bytes is the device copy alone. A source changed in place (its
version counter moved) gets a new twin; the old one, like the twin of a source that died
and every twin of a keep=False move, is retired: freed only once no move that took it is
still to enqueue its copy and every copy that read it has completed (an event on each
copy's stream), so pinned memory that a copy still reads is never handed out again.

A large one-time move (sources no twin is kept for, STREAM_MIN_BYTES or more in one call:
a module's weights arriving once) is streamed instead: its bytes pass, packed in order, through
a few page-locked slots the staging keeps, each slot's device copy enqueued as soon as the CPU
has filled it and the slot refilled once that copy has completed. Twins for it would page-lock
as many fresh bytes as it moves, and page-locking costs far more than the copy
(docs/HOSTS.md has the figures); the calling thread waits for the slots,
so it returns once the last chunk is enqueued. GPU tensors leaving the device for good (a
quantized block's weights) stream back through the same slots into pageable memory
(to_host): each slot's pieces copied into it on their source's stream, then out of it by the
CPU once those copies have completed, while the next slots fill.

On the GPU backends the twins live in page-locked memory, which the device addresses at
the same pointer (unified addressing): the copy plan reads them as the target device's
memory. On the host-memory backends (CPU, the test backends) a twin is plain CPU memory
described as the target's virtual device, and every call waits for its copy (the host
itself reads the result)."""
import collections
import ctypes
import threading
import weakref

import numpy as np
import torch

from . import _abi
from ._dlpack import byte_vectors
from .streams import current_streams, resolved_device


def stageable(t):
    """Why `t` cannot take the pinned path (None if it can): PyTorch's own copy keeps what
    a byte copy would lose."""
    if not isinstance(t, torch.Tensor):
        return "a %s, not a tensor" % type(t).__name__
    if t.device.type != "cpu":
        return "not in CPU memory"
    if t.requires_grad:
        return "a tensor that requires grad (autograd records the move)"
    if not t.is_contiguous():
        return "a non-contiguous tensor"
    if t.numel() == 0:
        return "an empty tensor"
    return None


STREAM_MIN_BYTES = 64 << 20  # a one-time move this large streams through the slots
SLOT_BYTES, SLOTS = 16 << 20, 4


class _Slot:
    """A page-locked chunk of the stream and the ticket of the last copy that read it."""
    __slots__ = ("buffer", "ticket")

    def __init__(self, buffer):
        self.buffer, self.ticket = buffer, None


class _Twin:
    """A source's pinned bytes (the page-locked source itself, when it is one); kept: held
    for the source's next move, else retired once its copies are done. users: the moves that
    took it and have not yet recorded their copy's ticket; tickets: the recorded copies not
    yet seen complete (moves on several threads and streams may read one twin at once)."""
    __slots__ = ("buffer", "version", "data", "tickets", "users", "kept")

    def __init__(self, buffer, version, data):
        self.buffer, self.version, self.data, self.tickets, self.users, self.kept = buffer, version, data, [], 1, False

    def copied(self, ticket):
        """A move that took it has enqueued its copy (ticket: its event, None where the copy
        was waited for); under the staging's lock."""
        self.users -= 1
        self.tickets = self._pending() + ([ticket] if ticket is not None else [])

    def done(self):
        """Whether no copy reads it any more (under the staging's lock)."""
        self.tickets = self._pending()
        return not self.users and not self.tickets

    def _pending(self):
        return [t for t in self.tickets if not t.query()]


class PinnedStaging:
    """Pinned twins of CPU tensors and the device copies from them, for one Context.
    Thread-safe."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._lock = threading.RLock()  # a source's death (weakref callback) may come inside a call
        self._twins = {}  # id(source) -> (weakref to source, _Twin)
        self._retiring = []  # twins a copy may still read, each freed once done()
        self._slots = []  # the stream's page-locked chunks, made at the first streamed move
        self._stream_lock = threading.Lock()  # one streamed move at a time owns the slots
        self._counts = dict.fromkeys(("copies", "leaves", "twins_made", "twins_reused", "twins_refreshed",
                                      "pinned_sources", "inference_sources", "bytes_pinned", "bytes_copied",
                                      "streamed", "bytes_streamed", "streamed_back", "bytes_streamed_back"), 0)

    def counters(self):
        """copies: qlink copy_batch calls; leaves: tensors moved; twins_made / _reused /
        _refreshed: pinned twins created, found unchanged, replaced after an in-place
        change of their source; pinned_sources: sources already page-locked, read in
        place; bytes_pinned: host bytes copied into twins; bytes_copied:
        bytes copied to devices; streamed, bytes_streamed: sources (and their bytes) that
        went through the stream's slots instead of twins; streamed_back, bytes_streamed_back:
        GPU tensors (and their bytes) copied back to pageable memory through the slots
        (to_host); retiring: twins waiting for their last copy."""
        with self._lock:
            return dict(self._counts, kept=len(self._twins), retiring=len(self._retiring))

    def to_device(self, sources, device, keep=False, into=None):
        """Copies of the CPU tensors `sources` (each stageable) on `device` (a torch
        device on the GPU backends, a virtual device index on the host-memory ones), in
        order. keep: hold each source's pinned twin for its next move. into: the tensors
        the copies go to (each contiguous, its source's shape and dtype, on `device`; host
        tensors on the host-memory backends), returned; new ones otherwise."""
        for i, t in enumerate(sources):
            reason = stageable(t)
            if reason:
                raise ValueError("sources[%d] cannot be staged: %s" % (i, reason))
        ctx = self._ctx
        if ctx.cpu_memory:
            index = int(device)
            if not 0 <= index < ctx.device_count:
                raise ValueError("device %d does not exist: the %s backend has %d" % (
                    index, ctx.backend, ctx.device_count))
            where = torch.device("cpu")
        else:
            where = resolved_device(device)
            if where.type != "cuda":
                raise ValueError("device %s is not a GPU" % where)
            index = where.index
        if into is None:
            targets = [torch.empty(t.shape, dtype=t.dtype, device=where) for t in sources]
        else:
            targets = list(into)
            _check_into(sources, targets, where)
        self._sweep()
        streamed = self._to_stream(sources, keep)
        twinned = [i for i in range(len(sources)) if i not in streamed]
        streams = None if ctx.cpu_memory else current_streams(ctx, [index])
        if twinned:
            twins, ticket = [], None
            try:
                for i in twinned:  # each taken counts as a user until the finally below
                    twins.append(self._twin(sources[i], keep))
                # The twins were written before the call (ready) and stay untouched until
                # their tickets say the copies are done (held): only the target's stream orders it.
                self._copy([tw.data for tw in twins], [targets[i].data_ptr() for i in twinned],
                           [sources[i].numel() * sources[i].element_size() for i in twinned], index, streams)
                ticket = None if ctx.cpu_memory else _event_after_copy(index)
            finally:
                with self._lock:
                    for tw in twins:
                        tw.copied(ticket)
                    self._retiring.extend(tw for tw in twins if not tw.kept)
        if streamed:
            self._stream([sources[i] for i in streamed], [targets[i] for i in streamed], index, streams)
        with self._lock:
            self._counts["leaves"] += len(sources)
            self._counts["bytes_copied"] += sum(t.numel() * t.element_size() for t in sources)
        return targets

    def _copy(self, src_pointers, dst_pointers, nbytes, index, streams):
        """One copy_batch of host bytes to device `index`, on `streams` (the host-memory
        backends wait for it)."""
        ctx = self._ctx
        nbytes = np.array(nbytes, dtype=np.int64)
        src = byte_vectors(np.array(src_pointers, dtype=np.uint64), nbytes, ctx.device_type, index)
        dst = byte_vectors(np.array(dst_pointers, dtype=np.uint64), nbytes, ctx.device_type, index)
        args = _abi.CopyArgs(ctypes.sizeof(_abi.CopyArgs), src.pointer, dst.pointer, src.count,
                             *ctx.stream_list(streams), _abi.copy_flags(True, True, ctx.cpu_memory))
        ctx.invoke("copy_batch", ctypes.byref(args))
        with self._lock:
            self._counts["copies"] += 1

    def _to_stream(self, sources, keep):
        """The indices of the sources a streamed move takes: the pageable ones no twin would
        be kept for, when they add up to STREAM_MIN_BYTES."""
        once = [i for i, t in enumerate(sources) if not _kept(t, keep) and not self._read_in_place(t)]
        if sum(sources[i].numel() * sources[i].element_size() for i in once) < STREAM_MIN_BYTES:
            return set()
        return set(once)

    def _stream(self, sources, targets, index, streams):
        """Each source's bytes through the slots into its target, packed in order into the
        slots' fills (_slot_fills): a slot is filled once the copy that last read it has
        completed, and its pieces copied at once, in one copy_batch."""
        datas = [s.reshape(-1).view(torch.uint8) for s in sources]
        bases = [t.data_ptr() for t in targets]
        with self._stream_lock:
            self._make_slots()
            for turn, fill in enumerate(_slot_fills([d.numel() for d in datas], self._slots[0].buffer.numel())):
                slot = self._slots[turn % SLOTS]
                if slot.ticket is not None:
                    slot.ticket.synchronize()
                for run, offset, at, size in fill:
                    slot.buffer[at:at + size].copy_(datas[run][offset:offset + size])
                start = slot.buffer.data_ptr()
                self._copy([start + at for _, _, at, _ in fill], [bases[run] + offset for run, offset, _, _ in fill],
                           [size for _, _, _, size in fill], index, streams)
                slot.ticket = None if self._ctx.cpu_memory else _event_after_copy(index)
        with self._lock:
            self._counts["streamed"] += len(sources)
            self._counts["bytes_streamed"] += sum(t.numel() * t.element_size() for t in sources)

    def to_host(self, sources):
        """Copies of the GPU tensors `sources` (each contiguous, no autograd) in pageable CPU
        memory, in order, streamed back through the slots, a device's sources at a time: their
        bytes packed into the slots' fills (_slot_fills), each fill's pieces copied into its slot
        on their device's current stream (after the kernels that wrote them), then by the CPU
        out of the slot once those copies have completed, while the next slots fill. For
        tensors leaving the GPU for good (a quantized block's weights): page-locked copies
        would page-lock as many bytes as they move, and PyTorch's pageable copy waits for
        each tensor at a fraction of the link's speed."""
        for i, t in enumerate(sources):
            if not isinstance(t, torch.Tensor) or not t.is_cuda or not t.is_contiguous() or t.requires_grad:
                raise ValueError("sources[%d] cannot be streamed to the host: it must be a contiguous GPU "
                                 "tensor that needs no autograd" % i)
        targets = [torch.empty(t.shape, dtype=t.dtype) for t in sources]
        by_device = collections.defaultdict(list)
        for i, t in enumerate(sources):
            by_device[t.device.index].append(i)
        with self._stream_lock:
            self._make_slots()
            for index, runs in by_device.items():
                self._stream_back(index, [sources[i] for i in runs], [targets[i] for i in runs])
        with self._lock:
            self._counts["streamed_back"] += len(sources)
            self._counts["bytes_streamed_back"] += sum(t.numel() * t.element_size() for t in sources)
        return targets

    def _stream_back(self, index, sources, targets):
        """to_host's pass over the sources on device `index` (under _stream_lock)."""
        datas = [s.reshape(-1).view(torch.uint8) for s in sources]
        intos = [t.reshape(-1).view(torch.uint8) for t in targets]
        filling = collections.deque()  # (slot, its fill) copied from the GPU, not yet out of the slot
        for turn, fill in enumerate(_slot_fills([d.numel() for d in datas], self._slots[0].buffer.numel())):
            slot = self._slots[turn % SLOTS]
            if filling and filling[0][0] is slot:
                _drain(*filling.popleft(), intos)
            elif slot.ticket is not None:
                slot.ticket.synchronize()
            for run, offset, at, size in fill:
                slot.buffer[at:at + size].copy_(datas[run][offset:offset + size], non_blocking=True)
            slot.ticket = _event_after_copy(index)
            filling.append((slot, fill))
        while filling:
            _drain(*filling.popleft(), intos)

    def _make_slots(self):
        """The stream's page-locked slots, made at its first move (under _stream_lock)."""
        if not self._slots:
            pinned = not self._ctx.cpu_memory
            self._slots = [_Slot(torch.empty(SLOT_BYTES, dtype=torch.uint8, pin_memory=pinned))
                           for _ in range(SLOTS)]

    def _twin(self, source, keep):
        # An inference tensor (made under torch.inference_mode, as GPTQModel's captured
        # inputs are) has no version counter (_kept).
        version = None if source.is_inference() else source._version
        key, keep = id(source), _kept(source, keep)
        if self._read_in_place(source):
            # Already page-locked, maybe still being written by an asynchronous copy on the
            # stream this one joins: read in place, never by the CPU, held until copied.
            with self._lock:
                self._counts["pinned_sources"] += 1
            return _Twin(source, version, source.data_ptr())
        with self._lock:
            entry = self._twins.get(key)
            if entry is not None and entry[0]() is source:
                twin = entry[1]
                if twin.version == version and twin.buffer.numel() == source.numel() * source.element_size():
                    self._counts["twins_reused"] += 1
                    twin.users += 1
                    return twin
                self._counts["twins_refreshed"] += 1
                del self._twins[key]
                self._retiring.append(twin)
        nbytes = source.numel() * source.element_size()
        if version is None:
            with self._lock:
                self._counts["inference_sources"] += 1
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=not self._ctx.cpu_memory)
        buffer.copy_(source.reshape(-1).view(torch.uint8))
        twin = _Twin(buffer, version, buffer.data_ptr())
        with self._lock:
            self._counts["twins_made"] += 1
            self._counts["bytes_pinned"] += nbytes
            if keep:
                twin.kept = True
                displaced = self._twins.get(key)
                if displaced is not None:  # another move of the source missed too and stored its own
                    self._retiring.append(displaced[1])
                self._twins[key] = (weakref.ref(source, self._source_died(key)), twin)
        return twin

    def _read_in_place(self, source):
        """Whether a copy reads `source` itself: page-locked memory on a GPU backend."""
        return not self._ctx.cpu_memory and source.is_pinned()

    def _source_died(self, key):
        def retire(ref):
            with self._lock:
                entry = self._twins.get(key)
                if entry is not None and entry[0] is ref:
                    del self._twins[key]
                    self._retiring.append(entry[1])
        return retire

    def _sweep(self):
        """Frees the retired twins no copy reads any more."""
        with self._lock:
            self._retiring = [tw for tw in self._retiring if not tw.done()]

    def release(self):
        """Waits for every copy from a twin and frees them all (the next move makes new
        ones); a twin a move on another thread has taken and not yet copied from is freed
        once that copy is done."""
        with self._stream_lock, self._lock:
            twins = self._retiring + [entry[1] for entry in self._twins.values()]
            held = [(tw.buffer, t) for tw in twins for t in tw.tickets]
            held += [(slot.buffer, slot.ticket) for slot in self._slots]
            self._twins.clear()
            self._retiring, self._slots = [tw for tw in twins if tw.users], []
        for _, ticket in held:  # the buffers stay referenced by `held` until their copies are done
            if ticket is not None:
                ticket.synchronize()


def _kept(source, keep):
    """Whether a move asked to keep its twins keeps `source`'s: an inference tensor has no
    version counter to see a change in place by."""
    return keep and not source.is_inference()


def _check_into(sources, targets, where):
    if len(targets) != len(sources):
        raise ValueError("into has %d tensors for %d sources" % (len(targets), len(sources)))
    for i, (s, t) in enumerate(zip(sources, targets)):
        if not isinstance(t, torch.Tensor):
            raise ValueError("into[%d] is a %s, not a tensor" % (i, type(t).__name__))
        for field, got, want in (("device", t.device, where), ("shape", tuple(t.shape), tuple(s.shape)),
                                 ("dtype", t.dtype, s.dtype), ("contiguous", t.is_contiguous(), True)):
            if got != want:
                raise ValueError("into[%d]: %s is %s, expected %s" % (i, field, got, want))


def _slot_fills(sizes, slot_bytes):
    """Byte runs of `sizes` cut into pieces packed in order into fills of slot_bytes, each a
    slot's turn: [[(run, offset in the run, offset in the slot, size)]]. A module's many
    small tensors (an MoE block's experts) share a slot's copy instead of one each."""
    fills, fill, used = [], [], 0
    for run, total in enumerate(sizes):
        offset = 0
        while offset < total:
            if used == slot_bytes:
                fills.append(fill)
                fill, used = [], 0
            size = min(slot_bytes - used, total - offset)
            fill.append((run, offset, used, size))
            used, offset = used + size, offset + size
    if fill:
        fills.append(fill)
    return fills


def _drain(slot, fill, intos):
    """A fill's pieces, once their copies from the GPU have completed, out of the slot into
    their places in `intos`."""
    slot.ticket.synchronize()
    for run, offset, at, size in fill:
        intos[run][offset:offset + size].copy_(slot.buffer[at:at + size])
    slot.ticket = None


def _event_after_copy(index):
    """An event on device `index`'s current stream, after the copy just enqueued there."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(index))
    return event
