"""GPTQ's Hessian partials as calibration hooks build them, through qlink's native
hessian_accumulate: H_d += X^T X per device, stream-ordered (no host synchronization per
batch), the host's activations read in place (bf16, fp16 or fp32, any leading dims).

Modules that read the same input in the same forward (q/k/v, gate/up) share one
accumulation: a partial is a value, named by where it came from. add(x, partial) never
writes `partial`; it returns the partial after x, a new tensor, and a second add of the
same input to the same partial (the same tensor object, or both None) returns that tensor
again without computing anything. Modules whose partials have been equal so far and read
one input keep holding one tensor; a module whose input differs gets its own. Because the
given partial is never written, a refused or failed call leaves the caller's state as it
was."""
import threading
import weakref

import torch

from ..p2p import default_context
from .gptq import _streams


def _input_key(x):
    """What identifies x's data while x is alive: its memory, layout, dtype and device
    (views made by .data, reshape or indexing of one tensor agree)."""
    if x.is_contiguous():  # the same rows whatever the leading dimensions: X^T X of (rows, columns)
        layout = (x.numel() // max(x.shape[-1], 1), x.shape[-1])
    else:
        layout = (tuple(x.shape), tuple(x.stride()))
    return (x.device.type, x.device.index, x.data_ptr(), layout, x.dtype)


class _Done:
    """One accumulation: `before` + X^T X = `after`. Holds x, so no other tensor can take
    its memory (and its key) while the entry can still be matched."""

    __slots__ = ("before", "x", "after")

    def __init__(self, before, x, after):
        self.before = None if before is None else weakref.ref(before)
        self.x, self.after = x, weakref.ref(after)

    def result_for(self, partial):
        """The partial after x when this entry was made from `partial`, else None."""
        if (self.before is None) != (partial is None):
            return None
        if self.before is not None and self.before() is not partial:
            return None
        return self.after()

    def alive(self):
        return self.after() is not None and (self.before is None or self.before() is not None)


class HessianAccumulator:
    """H_d += X^T X for calibration hooks (see the module's docstring).

    ctx: the qlink context (default: the process default). precision: "ieee_fp32",
    "tensor", "tensor_gemm" or None (the context's config hessian_precision); fp32 inputs are
    always IEEE.
    Thread-safe; concurrent adds on different devices run side by side."""

    def __init__(self, ctx=None, precision=None):
        self.ctx = ctx or default_context()
        self.precision = precision
        self._lock = threading.Lock()
        self._done = {}
        self._made = {}  # id -> weakref of every partial add() made that is still alive
        self._counts = {"accumulations": 0, "shared": 0, "rows": 0, "calls": 0}

    def add(self, x, partial=None, device=None, blocks=1):
        """The partial after x: `partial` (fp32 (columns, columns), or None for zeros) plus
        x^T x, x (..., columns) contiguous on the partial's device. device: the qlink device
        id where the tensors do not say (the CPU backend's virtual devices). A new tensor,
        enqueued on the device's current stream; `partial` is not written. An input with no
        rows returns `partial` as it is. blocks: as add_many's."""
        return self.add_many([(x, partial, blocks)], device)[0]

    def add_many(self, items, device=None):
        """add() for every (x, partial) or (x, partial, blocks) of `items`, all on one device,
        in one native call: the partials of an MoE layer's experts, each from its own routed
        rows. blocks: x's rows in that many equal consecutive blocks, each its own rank-k
        update added to the partial in turn, as a host adding one sample at a time sums them
        (the rounding of a sum depends on its blocking), or a list of the blocks' row counts
        where they differ (an expert's routed rows, sample by sample). Returns the partials after, in
        order; an item matching an accumulation already made, or an earlier item of the call
        (gate and up of one expert), shares its result."""
        results, pending = [], {}  # key -> (partial, x, after, blocks) of the first item computing it
        with self._lock:
            for x, partial, *rest in items:
                blocks = rest[0] if rest else 1
                columns = x.shape[-1] if x.dim() else 0
                if columns == 0 or x.numel() == 0:
                    results.append(partial)
                    continue
                key = (None if partial is None else id(partial), _input_key(x))
                done = self._done.get(key)
                after = None if done is None else done.result_for(partial)
                if after is None and key in pending:
                    after = pending[key][2]
                if after is not None:
                    self._counts["shared"] += 1
                    results.append(after)
                    continue
                if partial is None:
                    after = torch.zeros((columns, columns), dtype=torch.float32, device=x.device)
                else:
                    after = partial.clone(memory_format=torch.contiguous_format)
                pending[key] = (partial, x, after, blocks)
                results.append(after)
        if not pending:
            return results
        self._accumulate([(x, after, blocks) for _, x, after, blocks in pending.values()], device)
        with self._lock:
            for stale in [k for k, d in self._done.items() if not d.alive()]:
                del self._done[stale]
            for stale in [k for k, r in self._made.items() if r() is None]:
                del self._made[stale]
            for key, (partial, x, after, _) in pending.items():
                self._done[key] = _Done(partial, x, after)
                self._made[id(after)] = weakref.ref(after)
        return results

    def add_into(self, items, device=None):
        """partial += x^T x, in place, for every (x, partial) or (x, partial, blocks) of
        `items` (blocks as add_many's), all on one device, in one native call: for partials
        the caller alone holds (an MoE stage's experts, each partial its own), where add_many's
        new tensor a call would be a copy of every partial. Nothing is shared or remembered."""
        items = [(x, partial, rest[0] if rest else 1) for x, partial, *rest in items
                 if x.dim() and x.shape[-1] and x.numel()]
        if items:
            self._accumulate(items, device)

    def _accumulate(self, items, device):
        """after += x^T x for each (x, after, blocks), in one native call; counted."""
        inputs, targets, outputs = [], [], []
        for x, after, blocks in items:
            rows = x.reshape(-1, x.shape[-1])
            sizes = [rows.shape[0] // blocks] * blocks if isinstance(blocks, int) else list(blocks)
            split = list(torch.split(rows, sizes)) if len(sizes) > 1 else [x]
            inputs += split
            targets += [len(outputs)] * len(split)
            outputs.append(after)
        ids = None if device is None else [int(device)]
        self.ctx.hessian_accumulate(inputs, outputs, None if ids is None else ids * len(inputs),
                                    None if ids is None else ids * len(outputs), _streams(self.ctx, outputs),
                                    precision=self.precision, input_partials=targets if len(outputs) > 1 else None)
        with self._lock:
            self._counts["rows"] += sum(x.numel() // x.shape[-1] for x, _, _ in items)
            self._counts["accumulations"] += len(items)
            self._counts["calls"] += 1

    def made(self, partial):
        """Whether `partial` is a tensor add() returned and may share with other holders
        (so a host must not write it in place)."""
        with self._lock:
            ref = self._made.get(id(partial))
            return ref is not None and ref() is partial

    def clear(self):
        """Forgets every accumulation (and the inputs held for them)."""
        with self._lock:
            self._done.clear()
            self._made.clear()

    def counters(self):
        """{"accumulations": partials computed, "shared": adds answered by one already made,
        "rows": rows accumulated, "calls": native calls (add_many makes many partials in one)}"""
        with self._lock:
            return dict(self._counts)
