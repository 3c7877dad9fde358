"""GPTQModel's per-batch Hessian (GPTQ.add_batch, which runs process_batch and
compute_hessian_xtx: an fp32 copy of the input, one X^T X per module per batch and a
device synchronization after each) through qlink.quant.HessianAccumulator: the hook's input
read in place by hessian_accumulate on the device's current stream, no synchronization, and
modules reading one input in one forward (q/k/v, gate/up) sharing one accumulation and one
partial tensor. The result lands where GPTQModel keeps it: _device_hessian_partials[device],
_device_sample_counts, nsamples, fwd_counter, _hessian_dirty, so its merge (or qlink's, in
device order) and its solve find it as they would their own.

The calls of one forward are queued and made as one native call (many partials, each
named by its input: an MoE layer's 256 expert linears per batch in one call rather than
256), when a module's next batch arrives, or before anything reads a partial
(materialize_global_hessian, the host path, uninstall: flush()). The counts GPTQModel
reads between forwards (fwd_counter: which experts were reached) move at once; the
partial lands with the flush. A queued call is never half-applied: the whole queue lands,
or each of its calls has its counts taken back and goes to GPTQModel's own add_batch, in
order.

In grouped forwards (input_cache.grouped: several one-sample batches in one forward) each
sample's rows stay a rank-k update of their own, as GPTQModel added them one sample per
forward: a (samples, ...) input in equal blocks, a routed expert's 2-D rows by the counts
qlink's routed experts' loop gives for each sample (defuser_moe), a 2-D input of every
sample's tokens flattened sample by sample (OPT's fc1 and fc2 read (tokens, hidden)) in
equal blocks of a sample's tokens; a 2-D input of another count of rows (tokens some module
chose: only MoE routing, which grouping_refusal keeps from grouped forwards outside qlink's
loop) takes GPTQModel's path.

What add_batch does not take, it hands to GPTQModel's own add_batch, counted with the
reason; with strict=True it raises FallbackRefused naming the layer and the reason."""
import collections
import contextlib
import threading

import torch

from . import defuser_moe
from .contract import count_batch
from ..patches import FallbackRefused, like

PATCH = "add_batch"
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A queued add_batch: its arguments, the input as rows, and the task's counts before it.
_Call = collections.namedtuple("_Call", "gptq inp out x blocks device batch_index count_before dirty_before")


def unsupported(gptq, inp, host, ctx):
    """Why qlink cannot accumulate this batch as GPTQModel would, or None."""
    module = gptq.module
    cls = type(gptq)
    checks = [
        # A subclass that changed how the product is made keeps its own (GPTAQ and FOEM
        # override add_batch itself and never get here).
        (any(getattr(cls, m, None) is not getattr(host.GPTQ, m, None)
             for m in ("process_batch", "compute_hessian_xtx")),
         "a GPTQ subclass (%s) with its own Hessian" % cls.__name__),
        # GPTQModel unfolds a convolution's input; Linear (and its subclasses) reads it as is.
        (not isinstance(module, torch.nn.Linear),
         "a %s layer (its input is reshaped by GPTQModel)" % type(module).__name__),
        (bool(getattr(gptq, "_tp_pad_cols", 0)), "tensor-parallel column padding"),
        (not torch.is_tensor(inp), "an input that is not a tensor"),
    ]
    for failed, reason in checks:
        if failed:
            return reason
    if inp.dtype not in _INPUT_DTYPES:
        return "a %s input" % str(inp.dtype).replace("torch.", "")
    if inp.dim() == 0 or inp.shape[-1] != gptq.columns:
        return "an input of %s for %d columns" % (tuple(inp.shape), gptq.columns)
    staging = getattr(getattr(gptq.qcfg, "hessian", None), "staging_dtype", torch.float32)
    if staging not in (torch.float32, inp.dtype) and inp.dtype != torch.float32:
        return "hessian.staging_dtype %s rounds the %s input" % (staging, inp.dtype)
    if ctx.cpu_memory and inp.device.type != "cpu":
        return "a %s input on the %s backend" % (inp.device.type, ctx.backend)
    if not ctx.cpu_memory and inp.device.type != "cuda":
        return "an input in CPU memory"
    return None


class Queue:
    """add_batch calls waiting for one native call (see the module's docstring). Thread-safe:
    the lock is held across a flush, so a task's next call waits for its last to land."""

    def __init__(self, installation):
        self.installation = installation
        self.lock = threading.RLock()
        self.items = []     # _Call, in arrival order
        self.tasks = set()  # id() of the tasks with a queued call
        self.stream = None  # where the queued inputs were made (a GPU's current stream)

    def put(self, gptq, inp, out, x, blocks, device, batch_index):
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        rows = x.numel() // x.shape[-1]
        with self.lock:
            if id(gptq) in self.tasks or (self.items and stream != self.stream):
                self.flush()  # a task's partials chain batch to batch; one stream per call
            with gptq.lock:
                call = _Call(gptq, inp, out, x, blocks, device, batch_index,
                             gptq._device_sample_counts.get(device), gptq._hessian_dirty)
                count_batch(gptq, device, rows)
            self.items.append(call)
            self.tasks.add(id(gptq))
            self.stream = stream

    def flush(self):
        """Every queued call made, as one native call; its partials landed in their tasks."""
        with self.lock:
            items, self.items, self.tasks = self.items, [], set()
            if not items:
                return
            inst = self.installation
            try:
                with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
                    afters = inst.accumulator.add_many(
                        [(c.x, c.gptq._device_hessian_partials.get(c.device), c.blocks) for c in items])
            except Exception as error:  # noqa: BLE001 (nothing landed: each call goes to the host's path)
                for c in items:
                    with c.gptq.lock:  # the counts as they were before the call
                        count_batch(c.gptq, c.device, -(c.x.numel() // c.x.shape[-1]), fwd=-1)
                        if c.count_before is None:
                            del c.gptq._device_sample_counts[c.device]
                        c.gptq._hessian_dirty = c.dirty_before
                reason = "%s: %s" % (type(error).__name__, error)
                for c in items:
                    host_path(inst, c.gptq, c.inp, c.out, c.batch_index, reason, error)
                return
            for c, after in zip(items, afters):
                with c.gptq.lock:
                    c.gptq._device_hessian_partials[c.device] = after
                inst.counters.qlink(PATCH)


def host_path(installation, gptq, inp, out, batch_index, reason, error=None):
    """GPTQModel's own add_batch for this call (FallbackRefused instead under strict),
    counted with the reason."""
    if installation.strict:
        raise FallbackRefused("add_batch of layer '%s': %s, and strict=True forbids GPTQModel's own" % (
            gptq.name, reason)) from error
    (installation.counters.fallback if error is not None else installation.counters.host)(PATCH, reason)
    with gptq.lock:
        # GPTQModel adds in place: a partial qlink made may be shared with other layers.
        for device, partial in list(gptq._device_hessian_partials.items()):
            if installation.accumulator.made(partial):
                gptq._device_hessian_partials[device] = partial.clone()
    return installation.host.add_batch(gptq, inp, out, batch_index=batch_index)


def sample_blocks(installation, inp, rows):
    """How add_many splits this input's rows: each sample of a grouped forward
    (input_cache) once a batch of its own, added one by one as GPTQModel added them: a
    (samples, ...) input's equal blocks, a routed expert's rows by the counts its loop
    gives (defuser_moe), a 2-D input of whole samples' tokens (a layer that flattened
    its (samples, tokens, hidden) states, as OPT's does before fc1) in equal blocks of one
    sample's tokens; 1 outside grouped forwards; None where they are not known."""
    if not installation.grouped:
        return 1
    if inp.dim() >= 3:
        return inp.shape[0]
    routed = defuser_moe.sample_blocks(rows)
    if routed is not None:
        return routed
    if rows % installation.sample_tokens == 0:
        # torch.flatten and reshape of a batch-first tensor keep each sample's rows together,
        # in sample order: block i is what sample i's own forward gave the hook
        return rows // installation.sample_tokens
    return None


def make_add_batch(installation, original):
    """GPTQ.add_batch for `installation` (qlink.integrations.gptqmodel's): its host,
    counters, strictness, HessianAccumulator and Queue."""
    ctx, queue = installation.ctx, installation.queue

    @like(original)
    def add_batch(gptq, inp, out, batch_index=None):
        reason = unsupported(gptq, inp, installation.host, ctx)
        if reason:
            queue.flush()  # the host's add reads the partial: the calls before it land first
            return host_path(installation, gptq, inp, out, batch_index, reason)
        x = inp.reshape(-1, inp.shape[-1])
        if x.shape[0] == 0:
            return None  # as GPTQModel: an empty batch changes nothing
        blocks = sample_blocks(installation, inp, x.shape[0])
        if blocks is None:
            queue.flush()
            return host_path(installation, gptq, inp, out, batch_index,
                             "a grouped forward's %d-row input whose samples' rows are not known" % x.shape[0])
        if not x.is_contiguous():
            x = x.contiguous()
        installation.ahead.seen(gptq)
        queue.put(gptq, inp, out, x, blocks, torch.device(inp.device), batch_index)
        return None
    return add_batch
