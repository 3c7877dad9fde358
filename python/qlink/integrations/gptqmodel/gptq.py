"""GPTQModel's per-module task as a subclass of its GPTQ, made where its processor builds
tasks (gptq_processor.GPTQ): the per-batch Hessian through qlink's accumulator
(hessian_queue.py), the partials merged in device order by qlink.reduce (tasks that read
one input, q/k/v or an expert's gate and up, holding one partial take one merged tensor, so
the engine inverts it once), the solve by qlink's native engine where it covers the task's
options (solve.py, solve_ahead.py). Each method falls back to GPTQModel's own (super()) with
its reason; GPTQModel's solve, which writes its task's Hessian in place, gets a copy of its own."""
import contextlib
import threading
import weakref

import torch

from ..patches import like
from .hessian_queue import make_add_batch
from .contract import merged, solved
from .solve import unsupported


def make_task_class(installation, original):
    """The GPTQ subclass the processor builds its tasks from while installed."""
    task_class = type(original.__name__, (original,), {
        "__module__": __name__, "__qualname__": original.__qualname__,
        "__doc__": "GPTQModel's GPTQ with qlink's add_batch, merge and solve (qlink.integrations.gptqmodel.gptq).",
        "add_batch": make_add_batch(installation, original.add_batch),
        "materialize_global_hessian": make_materialize_global_hessian(installation,
                                                                      original.materialize_global_hessian),
        "quantize": make_quantize(installation, original.quantize)})
    installation.host.task_class = task_class
    return task_class


def _device_order(device):
    device = torch.device(device)
    return device.type, -1 if device.index is None else device.index


def _merge_refusal(ctx, partials, target):
    """Why qlink.reduce cannot merge these partials (sorted in device order) into
    `target`, or None."""
    tensors = [p for _, p in partials]
    if any(p.dtype != torch.float32 or not p.is_contiguous() for p in tensors):
        return "a partial that is not contiguous fp32"
    if ctx.cpu_memory:  # the CPU backend's virtual devices stand in for the partials' devices
        if len(tensors) > ctx.device_count or target.type != "cpu" or any(p.is_cuda for p in tensors):
            return "partials the %s backend's %d devices cannot hold" % (ctx.backend, ctx.device_count)
    elif target.type != "cuda" or not all(p.is_cuda for p in tensors):
        return "a partial or the merged Hessian in CPU memory"
    return None


class SharedMerges:
    """Merged Hessians by the partials (the same tensors, the same sample count and target)
    they were made from, while both live: a second task of those partials takes the same
    merged tensor. One that GPTQModel's own solve is to take is copied first (own()). Tasks
    of one set of partials find or make it one at a time (making()): GPTQModel's workers
    merge q, k and v together, and two that both missed would each make one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._made = {}  # key -> (weakref of the merged tensor, weakrefs of its partials)
        self._merged = {}  # id -> weakref of every merged tensor in _made
        self._making = {}  # key -> [its lock, the tasks holding or waiting for it]

    @contextlib.contextmanager
    def making(self, partials, total, target):
        """Held while a task finds, or makes and keeps, the merged tensor of these partials."""
        key = self._key(partials, total, target)
        with self._lock:
            slot = self._making.setdefault(key, [threading.Lock(), 0])
            slot[1] += 1
        try:
            with slot[0]:
                yield
        finally:
            with self._lock:
                slot[1] -= 1
                if not slot[1]:
                    del self._making[key]

    @staticmethod
    def _key(partials, total, target):
        return tuple((str(d), id(p)) for d, p in partials), total, str(target)

    def find(self, partials, total, target):
        """The merged tensor made from exactly these partials, or None."""
        with self._lock:
            entry = self._made.get(self._key(partials, total, target))
            hessian = entry[0]() if entry else None
            if hessian is None or any(r() is not p for r, (_, p) in zip(entry[1], partials)):
                return None
            return hessian

    def keep(self, partials, total, target, hessian):
        with self._lock:
            for key in [k for k, (h, _) in self._made.items() if h() is None]:
                del self._made[key]
            for key in [k for k, h in self._merged.items() if h() is None]:
                del self._merged[key]
            partial_refs = [weakref.ref(p) for _, p in partials]
            self._made[self._key(partials, total, target)] = (weakref.ref(hessian), partial_refs)
            self._merged[id(hessian)] = weakref.ref(hessian)

    def own(self, gptq):
        """gptq, its Hessian a copy of its own where it is a merged tensor another task may
        hold (GPTQModel's solve writes it in place)."""
        hessian = getattr(gptq, "H", None)
        with self._lock:
            ref = self._merged.get(id(hessian)) if hessian is not None else None
            if ref is not None and ref() is hessian:
                gptq.H = hessian.clone()
        return gptq


def make_materialize_global_hessian(installation, original):
    ctx, counters, guard = installation.ctx, installation.counters, installation.guard
    patch = "materialize_global_hessian"

    @like(original)
    def materialize_global_hessian(gptq, target_device=None):
        installation.queue.flush()  # the forward's last calls land before the partials are read
        with gptq.lock:
            # Device order for whichever sums them, so the merge no longer depends on the
            # order the partials arrived in.
            partials = sorted(gptq._device_hessian_partials.items(), key=lambda kv: _device_order(kv[0]))
            gptq._device_hessian_partials = dict(partials)
            total = sum(gptq._device_sample_counts.values())
            target = gptq._select_hessian_target_device(target_device)
            if not gptq._hessian_dirty or total == 0 or not partials:
                reason = "nothing to merge"
            else:
                reason = _merge_refusal(ctx, partials, target)
            # Shared only where the engine solves it: GPTQModel's solve writes its H in place.
            shareable = reason is None and unsupported(gptq, installation.host) is None

            def merge():
                merged = torch.empty(gptq.columns, gptq.columns, dtype=torch.float32, device=target)
                ids = list(range(len(partials))) if ctx.cpu_memory else None
                ctx.reduce([p for _, p in partials], merged, 2.0 / total, input_devices=ids,
                           output_device=0 if ids else None)
                return merged

            def commit(hessian):
                merged(gptq, hessian, total)
                if shareable:
                    installation.merges.keep(partials, total, target, hessian)
                return True

            def merged_here():
                """Whether this task took a merged tensor: the one its partials already made,
                else one qlink.reduce makes (False: the host's merge, once the lock is released)."""
                same = installation.merges.find(partials, total, target) if shareable else None
                if same is not None:
                    merged(gptq, same, total)
                    counters.qlink(patch)
                    return True
                return guard.attempt(patch, merge, lambda: False, commit)

            if reason is None:
                with installation.merges.making(partials, total, target) if shareable else contextlib.nullcontext():
                    if merged_here():
                        return None
            else:
                counters.host(patch, reason)
        return original(gptq, target_device)  # takes the lock itself
    return materialize_global_hessian


def make_quantize(installation, original):
    counters, guard = installation.counters, installation.guard

    @like(original)
    def quantize(gptq, blocksize=128):
        installation.queue.flush()  # the counts unsupported() reads include the forward's last calls
        reason = unsupported(gptq, installation.host)
        if reason:
            counters.host("quantize", reason)
            return original(installation.merges.own(gptq), blocksize)
        # GPTQModel's solve starts by merging the Hessian; merged here once, outside the
        # guard (what the host's merge raises is its own), the host's solve finds it
        # merged if qlink's fails (GPTQModel's merge returns at once when nothing is new).
        gptq.finalize_hessian(target_device=getattr(gptq.module, "target_device", None))
        return guard.attempt("quantize", lambda: installation.ahead.result_for(gptq),
                             lambda: original(installation.merges.own(gptq), blocksize),
                             commit=lambda result: solved(gptq, result))
    return quantize
