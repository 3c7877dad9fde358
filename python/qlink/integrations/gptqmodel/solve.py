"""GPTQModel's layer solve (GPTQ.quantize) through qlink's native GPTQ engine, for the
options the engine covers; which ones it does not is said here, so the adapter can send
those layers to GPTQModel's own solve."""
import math
import time

import torch

from ...quant.gptq import GPTQLayer, parallel_gptq

SUPPORTED_BITS = (2, 3, 4, 8)


def unsupported(gptq, host):
    """Why the engine cannot solve this GPTQ task as GPTQModel would, or None. host: the
    adapter's view of GPTQModel (its GPTQ and Quantizer classes, should_use_fallback)."""
    qcfg, module, quantizer = gptq.qcfg, gptq.module, getattr(gptq, "quantizer", None)
    checks = [
        (type(gptq) is not host.task_class, "a GPTQ subclass (%s) with its own solve" % type(gptq).__name__),
        (bool(getattr(qcfg, "mock_quantization", False)), "mock_quantization"),
        (float(getattr(qcfg, "mse", 0.0) or 0.0) > 0.0, "mse > 0 (a scale search per group)"),
        # GPTQModel then takes static ranges by visiting position, not by group: its own solve.
        (bool(getattr(qcfg, "act_group_aware", False)) and bool(qcfg.static_groups),
         "act_group_aware with static_groups"),
        # nn.Linear and its subclasses (GPTQModel's HookedLinear); Conv1D/Conv layers are not.
        (not isinstance(module, torch.nn.Linear),
         "a %s layer (the engine solves linear layers)" % type(module).__name__),
        (bool(getattr(gptq, "_tp_pad_cols", 0)), "tensor-parallel column padding"),
        (getattr(gptq, "module_copy", None) is not None, "a module_copy weight"),
        (type(quantizer) is not host.Quantizer, "a %s quantizer" % type(quantizer).__name__),
        (qcfg.bits not in SUPPORTED_BITS, "bits=%s" % (qcfg.bits,)),
        # GPTQModel then ends each row with a narrower group; the engine's groups are equal.
        (qcfg.group_size != -1 and gptq.columns % qcfg.group_size != 0,
         "group_size %s does not divide the %d columns" % (qcfg.group_size, gptq.columns)),
        (gptq.nsamples == 0, "no calibration samples"),
    ]
    for failed, reason in checks:
        if failed:
            return reason
    if quantizer.requires_groupwise_processing() or not getattr(quantizer, "perchannel", False):
        return "a quantizer without per-channel affine groups"
    if host.should_use_fallback(gptq.fallback, float(gptq.nsamples), gptq.expected_nsamples):
        return "a fallback strategy for too few samples"
    return None


def options_of(gptq):
    """The engine options GPTQModel's qcfg gives this task's solve, as a hashable key: tasks
    with equal keys (on one device) can be solved in one engine call."""
    qcfg = gptq.qcfg
    # -1 goes through as -1: the engine then takes each row's range before zeroing the dead
    # columns, as GPTQModel does, where a group as wide as the row takes it after. GPTQModel's
    # static groups exist only for a group_size: with -1 it ignores the flag, so does this.
    return (("bits", qcfg.bits), ("group_size", qcfg.group_size), ("sym", bool(qcfg.sym)),
            ("desc_act", bool(qcfg.desc_act)), ("static_groups", bool(qcfg.static_groups) and qcfg.group_size != -1),
            ("damp", qcfg.damp_percent), ("damp_auto_increment", qcfg.damp_auto_increment),
            ("act_group_aware", bool(getattr(qcfg, "act_group_aware", False))))


def solve(tasks, ctx, placement=None, engine_options=None):
    """GPTQ.quantize's result, (Q, scale, zero, g_idx, duration, avg_loss, damp, nsamples),
    for each task (finalize_hessian done; equal options_of, Hessians on one device) from one
    call of the native engine: each Hessian inverted once, tasks sharing one tensor (gate and
    up of an expert) sharing its inverse. Each layer's weight is read on its Hessian's device,
    Q comes back in the weight's shape, dtype and device; nothing of the tasks' changed. The
    engine's loss sum is divided by each task's own sample count here (the same double
    division the engine makes for one layer). Raises the engine's error, or ValueError for a
    NaN loss (GPTQModel's own solve knows what to do then). placement: the devices the
    engine may spread the solves over (a qlink.quant.placement.Placement of ctx's; None:
    each layer on its own device); the results do not depend on it. engine_options: the
    engine's own (inverse, tf32: qlink.quant.gptq_quantize), as install() sets them."""
    start = time.time()
    layers = [GPTQLayer(t.module.weight.data.to(t.H.device), t.H, name=t.name) for t in tasks]
    outs = parallel_gptq(layers, placement, ctx=ctx, nsamples=0, **dict(options_of(tasks[0])),
                         **(engine_options or {}))
    duration = (time.time() - start) / len(tasks)
    results = []
    for task, out in zip(tasks, outs):
        loss = float(out.loss) / task.nsamples
        if math.isnan(loss):
            raise ValueError("the engine's loss for %s is NaN" % task.name)
        module = task.module
        q = out.weight.reshape(module.weight.shape).to(dtype=module.weight.dtype, device=module.weight.data.device)
        results.append((q, out.scales, out.zeros, out.g_idx, duration, loss, float(out.damp), task.nsamples))
    return results


def small_outputs_on_cpu(results):
    """The results (solve()'s tuples) with their scales, zeros and g_idx on the CPU, brought
    there in one copy where they are on one GPU; as they are otherwise. GPTQModel's process
    streams each module's three to the CPU after its solve (a copy stream, pinned buffers, an
    event and a worker thread that waits for it, a module at a time): for an MoE layer's 384
    solves that machinery, not the bytes, is the cost, and it finds them already there."""
    small = [t for r in results for t in r[1:4]]
    devices = {t.device for t in small}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return results
    moved = iter(to_cpu_at_once(small))
    return [(r[0], next(moved), next(moved), next(moved)) + tuple(r[4:]) for r in results]


def to_cpu_at_once(tensors):
    """CPU copies of tensors on one device, made by one copy of their bytes (views of one
    buffer, in their shapes and dtypes)."""
    flat = [t.detach().contiguous().view(-1).view(torch.uint8) for t in tensors]
    buffer = torch.cat(flat).cpu()
    return [part.view(t.dtype).view(t.shape)
            for part, t in zip(torch.split(buffer, [f.numel() for f in flat]), tensors)]
