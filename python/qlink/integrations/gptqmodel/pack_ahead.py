"""GPTQModel's packing of a subset's layers done as the subset is solved: where the
solve-ahead solves several tasks in one engine call, their int32 words are made there, in
batches on the GPU (qlink.quant.gptq_pack_many), and brought to the CPU once; each layer's
finalizer then finds its words in the native packer's slot (qlinear) instead of packing on
its own thread, one layer at a time (an MoE layer's 384 finalizers each ran about 30 small
GPU operations under the GIL the layer loop needs).

Invariant: the slot is given a layer's words only for the layer of that name whose scales,
zeros and g_idx it is given are the solve's own, bit for bit, and whose weight agrees with
the solve's on a spread of its elements; otherwise it packs as before (counted "missed").
The words are gptq_pack's of the same inputs, so what GPTQModel registers is unchanged.
Words no finalizer took within the last three layers solved are dropped ("dropped")."""
import collections
import logging
import re
import threading

import torch

from ...quant.pack import gptq_pack_many

log = logging.getLogger("qlink")

_SAMPLES = 1024  # weight elements compared a layer
_LAYERS_KEPT = 3
_LAYER = re.compile(r"\.(\d+)\.")

_Words = collections.namedtuple("_Words", "name layer qweight qzeros scales zeros g_idx sample step")


def task_name(task):
    """The task's module path in the model (GPTQModel's NamedModule.full_name), which the
    quantized linear keeps as its name."""
    return getattr(getattr(task, "_named_module", None), "full_name", None) or task.name


def _layer_of(name):
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


class PackAhead:
    def __init__(self):
        self._lock = threading.Lock()
        self._words = {}   # name -> _Words
        self._layers = []  # layer keys in the order first offered, the last _LAYERS_KEPT kept
        self._counts = {"made": 0, "taken": 0, "missed": 0, "dropped": 0, "refused": 0}

    def counters(self):
        with self._lock:
            return dict(self._counts)

    def offer(self, tasks, results, bits):
        """The words of each task's result (GPTQ.quantize's tuple) made now, kept for its
        finalizer. Never raises: a batch that cannot be packed is counted ("refused") and its
        finalizers pack as before."""
        if bits not in (2, 4, 8) or any(getattr(t.qcfg, "pack_dtype", torch.int32) != torch.int32 for t in tasks):
            return
        groups = collections.defaultdict(list)
        for task, result in zip(tasks, results):
            q, scales = result[0], result[1]
            if q.dim() != 2 or q.shape[0] % 32 or q.shape[1] % 32:
                continue  # not the layout's: its finalizer's packer says so
            groups[(tuple(q.shape), q.dtype, q.device, tuple(scales.shape))].append((task_name(task), result))
        for members in groups.values():
            try:
                made = self._pack(members, bits)
            except Exception as error:  # noqa: BLE001 (the finalizers then pack each layer themselves)
                log.warning("qlink: %d layers' words not made ahead (%s: %s)", len(members), type(error).__name__,
                            error)
                with self._lock:
                    self._counts["refused"] += len(members)
                continue
            with self._lock:
                for words in made:
                    self._keep(words)

    def take(self, name, weight, scales, zeros, g_idx, bits):
        """(qweight, qzeros) made ahead for the layer `name`, where the slot's inputs are the
        solve's (see the module's docstring), else None."""
        with self._lock:
            words = self._words.pop(name, None)
        if words is None:
            return None
        if not _same_inputs(words, weight, scales, zeros, g_idx, bits):
            with self._lock:
                self._counts["missed"] += 1
            return None
        with self._lock:
            self._counts["taken"] += 1
        return words.qweight.clone(), words.qzeros.clone()

    def clear(self):
        with self._lock:
            self._counts["dropped"] += len(self._words)
            self._words.clear()
            self._layers.clear()

    def _pack(self, members, bits):
        results = [result for _, result in members]
        scales = [r[1].T.contiguous() for r in results]
        zeros = [r[2].T.contiguous() for r in results]
        g_idx = [r[3].to(torch.int32) for r in results]
        qweight, qzeros, refusals = gptq_pack_many([r[0] for r in results], scales, zeros, g_idx, bits)
        step = max(1, results[0][0].numel() // _SAMPLES)
        sample = torch.stack([r[0].reshape(-1)[::step] for r in results])
        # One copy to the CPU of each: the finalizers read them there.
        qweight, qzeros, sample = qweight.cpu(), qzeros.cpu(), sample.cpu()
        scales, zeros, g_idx = (torch.stack(ts).cpu() for ts in (scales, zeros, g_idx))
        return [_Words(name, _layer_of(name), qweight[i], qzeros[i], scales[i], zeros[i], g_idx[i], sample[i], step)
                for i, ((name, _), refusal) in enumerate(zip(members, refusals)) if refusal is None]

    def _keep(self, words):
        if words.layer not in self._layers:
            self._layers.append(words.layer)
            for stale in self._layers[:-_LAYERS_KEPT]:
                names = [n for n, w in self._words.items() if w.layer == stale]
                for n in names:
                    del self._words[n]
                self._counts["dropped"] += len(names)
            del self._layers[:-_LAYERS_KEPT]
        self._words[words.name] = words
        self._counts["made"] += 1


def _same_inputs(words, weight, scales, zeros, g_idx, bits):
    """Whether the slot's inputs are those the words were made from (see the module's
    docstring); the words' bit width is the one they were made for."""
    if words.qweight.shape[0] * 32 != weight.shape[-1] * bits or weight.dtype != words.sample.dtype:
        return False
    if not all(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b.cpu()) for a, b in
               ((words.scales, scales), (words.zeros, zeros), (words.g_idx, g_idx))):
        return False
    return torch.equal(words.sample, weight.reshape(-1)[::words.step].cpu())
