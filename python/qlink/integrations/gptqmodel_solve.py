"""GPTQModel's layer solve (GPTQ.quantize) through qlink's native GPTQ engine, for the
options the engine covers; which ones it does not is said here, so the adapter can send
those layers to GPTQModel's own solve."""
import math
import time

import torch

from ..quant.gptq import gptq_quantize

SUPPORTED_BITS = (2, 3, 4, 8)


def unsupported(gptq, host):
    """Why the engine cannot solve this GPTQ task as GPTQModel would, or None. host: the
    adapter's view of GPTQModel (its GPTQ and Quantizer classes, should_use_fallback)."""
    qcfg, module, quantizer = gptq.qcfg, gptq.module, getattr(gptq, "quantizer", None)
    checks = [
        (type(gptq) is not host.GPTQ, "a GPTQ subclass (%s) with its own solve" % type(gptq).__name__),
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


def solve(gptq, ctx):
    """GPTQ.quantize's result, (Q, scale, zero, g_idx, duration, avg_loss, damp, nsamples),
    from the native engine on the merged Hessian (finalize_hessian done), the layer's
    weight on its device, Q back in the weight's shape, dtype and device; nothing of the
    task's changed. Raises the engine's error, or ValueError for a NaN loss (GPTQModel's
    own solve knows what to do then)."""
    start = time.time()
    qcfg, module = gptq.qcfg, gptq.module
    result_device = module.weight.data.device
    hessian = gptq.H
    weight = module.weight.data.to(hessian.device)
    # -1 goes through as -1: the engine then takes each row's range before zeroing the dead
    # columns, as GPTQModel does, where a group as wide as the row takes it after. GPTQModel's
    # static groups exist only for a group_size: with -1 it ignores the flag, so does this.
    static_groups = bool(qcfg.static_groups) and qcfg.group_size != -1
    out = gptq_quantize(weight, hessian, bits=qcfg.bits, group_size=qcfg.group_size, sym=bool(qcfg.sym),
                        desc_act=bool(qcfg.desc_act), static_groups=static_groups, damp=qcfg.damp_percent,
                        damp_auto_increment=qcfg.damp_auto_increment, nsamples=gptq.nsamples,
                        act_group_aware=bool(getattr(qcfg, "act_group_aware", False)), ctx=ctx)
    loss = float(out.loss)
    if math.isnan(loss):
        raise ValueError("the engine's loss for %s is NaN" % gptq.name)
    q = out.weight.reshape(module.weight.shape).to(dtype=module.weight.dtype, device=result_device)
    return q, out.scales, out.zeros, out.g_idx, time.time() - start, loss, float(out.damp), gptq.nsamples


def done_with_hessian(gptq, result):
    """solve()'s result made the task's: its Hessian dropped, as GPTQModel's solve drops it."""
    del gptq.H
    return result
