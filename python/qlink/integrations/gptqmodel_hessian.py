"""GPTQModel's per-batch Hessian (GPTQ.add_batch, which runs process_batch and
compute_hessian_xtx: an fp32 copy of the input, one X^T X per module per batch and a
device synchronization after each) through qlink.quant.HessianAccumulator: the hook's input
read in place by hessian_accumulate on the device's current stream, no synchronization, and
modules reading one input in one forward (q/k/v, gate/up) sharing one accumulation and one
partial tensor. The result lands where GPTQModel keeps it: _device_hessian_partials[device],
_device_sample_counts, nsamples, fwd_counter, _hessian_dirty, so its merge (or qlink's, in
device order) and its solve find it as they would their own.

What add_batch does not take, it hands to GPTQModel's own add_batch, counted with the
reason; with strict=True it raises FallbackRefused naming the layer and the reason."""
import torch

from .patches import FallbackRefused

PATCH = "add_batch"
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
    if ctx.host_memory and inp.device.type != "cpu":
        return "a %s input on the %s backend" % (inp.device.type, ctx.backend)
    if not ctx.host_memory and inp.device.type != "cuda":
        return "an input in host memory"
    return None


def make_add_batch(installation):
    """GPTQ.add_batch for `installation` (qlink.integrations.gptqmodel's): its host,
    counters, strictness and HessianAccumulator."""
    original, ctx = installation.host.add_batch, installation.ctx
    counters, accumulator, strict = installation.counters, installation.accumulator, installation.strict

    def host_path(gptq, inp, out, batch_index, reason, error=None):
        if strict:
            raise FallbackRefused("add_batch of layer '%s': %s, and strict=True forbids GPTQModel's own" % (
                gptq.name, reason)) from error
        (counters.fallback if error is not None else counters.host)(PATCH, reason)
        with gptq.lock:
            # GPTQModel adds in place: a partial qlink made may be shared with other layers.
            for device, partial in list(gptq._device_hessian_partials.items()):
                if accumulator.made(partial):
                    gptq._device_hessian_partials[device] = partial.clone()
        return original(gptq, inp, out, batch_index=batch_index)

    def add_batch(gptq, inp, out, batch_index=None):
        reason = unsupported(gptq, inp, installation.host, ctx)
        if reason:
            return host_path(gptq, inp, out, batch_index, reason)
        x = inp.reshape(-1, inp.shape[-1])
        rows = x.shape[0]
        if rows == 0:
            return None  # as GPTQModel: an empty batch changes nothing
        if not x.is_contiguous():
            x = x.contiguous()
        device = torch.device(inp.device)
        with gptq.lock:
            try:
                partial = accumulator.add(x, gptq._device_hessian_partials.get(device))
            except Exception as error:  # noqa: BLE001
                caught = error
            else:
                gptq._device_hessian_partials[device] = partial
                gptq._device_sample_counts[device] = gptq._device_sample_counts.get(device, 0) + rows
                gptq.nsamples += rows
                gptq._hessian_dirty = True
                gptq.fwd_counter += 1
                counters.qlink(PATCH)
                return None
        return host_path(gptq, inp, out, batch_index, "%s: %s" % (type(caught).__name__, caught), caught)

    add_batch.__name__ = add_batch.__qualname__ = original.__name__
    add_batch.__doc__ = original.__doc__
    return add_batch
