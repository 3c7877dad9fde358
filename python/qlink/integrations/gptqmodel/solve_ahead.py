"""A subset's GPTQ solves in one engine call. GPTQModel quantizes a subset's modules after
the subset's forwards, each on a worker thread, one GPTQ.quantize at a time: an MoE layer's
384 expert linears are 384 calls (and gate and up of one expert invert one Hessian twice).
The first quantize of a subset takes every task that add_batch has fed, that the engine
covers and that shares its options and device, merges their Hessians as GPTQModel's own
quantize would, and solves them in one call (each Hessian inverted once, all of them in
flight together); the others' quantize calls then take their results. A result is only
given to a task whose Hessian is still the one it was solved with (the same merged tensor,
sample count and no pending partial); otherwise, and when the engine refuses the batch,
the task is solved alone. A batch refused for want of memory halves the batches after it;
the tasks of a batch refused otherwise are each solved alone (one Hessian the engine
refuses would otherwise fail every sibling's call over the rest: N calls of N layers).
The call's layers' packed words are made with it (pack_ahead), and their scales, zeros and
g_idx come to the CPU in one copy (GPTQModel's process moves each module's there). Where the
context has several devices, a call of more than one task may run on all of them (the engine
places the layers by cost: an MoE layer's experts spread over the GPUs), its first task's
device first; the results are the same."""
import collections
import logging
import threading
import weakref

import torch

from ...quant.placement import Placement
from .solve import options_of, small_outputs_on_cpu, solve, unsupported

log = logging.getLogger("qlink")

_Solved = collections.namedtuple("_Solved", "hessian nsamples result")


class SolveAhead:
    def __init__(self, installation):
        self.installation = installation
        self._lock = threading.Lock()
        self._seen = {}  # id -> weakref of each task add_batch fed, until solved, in feeding order
        self._solved = weakref.WeakKeyDictionary()  # task -> _Solved
        self._counts = {"calls": 0, "layers": 0, "ahead": 0, "refused": 0, "spread": 0}
        self._placements = {}  # device ids, home first -> Placement (its threads kept)
        self._most = None  # the most tasks a call takes, once a larger one ran out of memory
        self._alone = weakref.WeakSet()  # tasks of a batch the engine refused (not for memory)

    def seen(self, gptq):
        with self._lock:
            ref = self._seen.get(id(gptq))
            if ref is None or ref() is not gptq:  # new, or an id a collected task held
                self._seen.pop(id(gptq), None)
                self._seen[id(gptq)] = weakref.ref(gptq)

    def counters(self):
        with self._lock:
            return dict(self._counts)

    def result_for(self, gptq):
        """gptq's solve (finalize_hessian done): from an earlier call of its subset, or from
        one call over it and its siblings. Raises what solving it alone raises."""
        ctx = self.installation.ctx
        with self._lock:
            self._seen.pop(id(gptq), None)
            done = self._solved.pop(gptq, None)
            if done is not None and _unchanged(gptq, done):
                self._counts["ahead"] += 1
                return done.result
            fed = [ref() for ref in self._seen.values()]
            self._seen = {id(t): weakref.ref(t) for t in fed if t is not None}
            siblings = [] if gptq in self._alone else [
                t for t in fed if t is not None and t not in self._alone and self._sibling(t, gptq)]
            if self._most is not None:
                siblings = siblings[:self._most - 1]
            batch = [gptq] + siblings
            if siblings:
                try:
                    for t in siblings:
                        t.finalize_hessian(target_device=getattr(t.module, "target_device", None))
                    placement = self._spread(gptq)
                    results = solve(batch, ctx, placement, self.installation.engine_options)
                except Exception as error:  # noqa: BLE001 (each task then solves alone, as before)
                    self._counts["refused"] += 1
                    if "out of memory" in str(error).lower():
                        self._most = max(1, len(batch) // 2)
                    else:
                        self._alone.update(batch)
                    log.warning("qlink: %d GPTQ tasks in one call refused (%s: %s); this one solved alone, "
                                "the others in calls of at most %s", len(batch), type(error).__name__, error,
                                self._most or len(batch))
                else:
                    self._count(batch)
                    self._counts["spread"] += placement is not None
                    self.installation.packs.offer(batch, results, gptq.qcfg.bits)
                    results = small_outputs_on_cpu(results)
                    for t, result in zip(siblings, results[1:]):
                        self._seen.pop(id(t), None)
                        self._solved[t] = _Solved(t.H, t.nsamples, result)
                    return results[0]
            result = solve([gptq], ctx, engine_options=self.installation.engine_options)[0]
            self._count([gptq])
            return result

    def _spread(self, gptq):
        """Every device of the context, gptq's first, or None where there is one."""
        ctx = self.installation.ctx
        if ctx.cpu_memory:  # the CPU backend's virtual devices; the tasks' tensors are on device 0
            count, home = ctx.device_count, 0
        else:
            count, home = min(ctx.device_count, torch.cuda.device_count()), _device(gptq).index
        if count < 2 or home is None:
            return None
        ids = tuple([home] + [d for d in range(count) if d != home])
        if ids not in self._placements:
            self._placements[ids] = Placement(list(ids), ctx=ctx)
        return self._placements[ids]

    def _count(self, batch):
        self._counts["calls"] += 1
        self._counts["layers"] += len(batch)

    def _sibling(self, task, gptq):
        """Whether `task` can be solved in gptq's call: fed, its solve not yet asked for,
        covered by the engine with gptq's options, its weight on gptq's device."""
        if task is gptq or task.nsamples == 0 or not task._device_hessian_partials and getattr(task, "H", None) is None:
            return False
        if unsupported(task, self.installation.host) is not None or options_of(task) != options_of(gptq):
            return False
        return _device(task) == _device(gptq)


def _device(task):
    target = getattr(task.module, "target_device", None)
    return torch.device(target) if target is not None else task.module.weight.device


def _unchanged(task, done):
    return (getattr(task, "H", None) is done.hessian and task.nsamples == done.nsamples
            and not task._device_hessian_partials)
