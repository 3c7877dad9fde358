"""GPTQModel's layer loop (ModuleLooper): the loop run inside the process settings it
asks for (process_settings.py), the calibration cache moved to the GPU once and its
one-sample batches grouped (input_cache.py), layer 0's landing page-locked ahead while the
capture runs on the CPU, a task's quantizer moved to its device through qlink's moves
before GPTQModel's own Module.to finds it there."""
import contextlib

import torch

from ..patches import like
from ..process_settings import fixed_segments, short_switch_interval
from . import input_cache
from ...moves import has_meta, module_tensors, warm_pinned_host
from ...streams import resolved_device


def make_loop(installation, original):
    counters = installation.counters
    seconds, fixed = installation.switch_interval, installation.fixed_segments

    @like(original)
    def loop(looper, *args, **kwargs):
        with contextlib.ExitStack() as settings:
            settings.callback(installation.prefetch.forget)  # the last layer's copies for its modules' fills
            settings.enter_context(installation.loop.running(looper.processors))
            if seconds is None:
                counters.host("switch_interval", "switch_interval=None")
            else:
                counters.record("switch_interval", settings.enter_context(short_switch_interval(seconds)))
            if fixed:
                counters.record("fixed_segments", settings.enter_context(fixed_segments()))
            else:
                counters.host("fixed_segments", "fixed_segments=False")
            return original(looper, *args, **kwargs)
    return loop


def make_cache_inputs(installation, original):
    h, ctx, counters, guard = installation.host, installation.ctx, installation.counters, installation.guard

    @like(original)
    def cache_inputs(looper, *args, **kwargs):
        layers = kwargs["layers"] if "layers" in kwargs else (args[0] if args else None)
        _warm_landing(installation, layers)
        cache = original(looper, *args, **kwargs)
        # The host's cache is kept if a step fails: its capture ran once.
        device, reason = input_cache.placement(ctx, looper.gptq_model.quantize_config.device, cache)
        if reason:
            counters.host("cache_inputs", reason)
        else:
            moved = cache
            cache = guard.attempt("cache_inputs", lambda: input_cache.on_device(ctx, moved, device), lambda: moved)
        installation.sample_tokens, plan = None, None
        reason = input_cache.grouping_refusal(looper, layers, h, h.routed)
        if reason is None:
            plan, reason = input_cache.grouping_plan(cache)
        if reason:
            counters.host("group_batches", reason)
            return cache

        def commit(grouped):
            # add_batch: each hook input is one sample per row of dim 0, or flattened to
            # its samples' tokens, each sample as many tokens as every other (grouping_plan)
            first = cache.layer_inputs[0][0]
            installation.sample_tokens = first.numel() // first.shape[-1]
            return grouped
        return guard.attempt("group_batches", lambda: input_cache.grouped(cache, plan), lambda: cache, commit)
    return cache_inputs


def _warm_landing(installation, layers):
    """The page-locked blocks of layer 0's landing (its move to the CPU once solved, whose
    page-locking leaves the GPU idle) made on a thread while GPTQModel's capture runs its
    embedding on the CPU (qlink.moves.warm_pinned_host)."""
    ctx, counters = installation.ctx, installation.counters
    if ctx.cpu_memory:
        reason = "the %s backend computes in CPU memory" % ctx.backend
    elif not layers:
        reason = "no layers"
    elif not isinstance(layers[0], torch.nn.Module):
        reason = "layer 0 is a %s, not a module" % type(layers[0]).__name__
    else:
        params, buffers = module_tensors(layers[0])
        reason = warm_pinned_host(params + buffers)
    if reason:
        counters.host("pinned_warmup", reason)
    else:
        counters.qlink("pinned_warmup")


def make_rehome_processor_task(installation, original):
    ctx, counters, guard = installation.ctx, installation.counters, installation.guard

    @like(original)
    def _rehome_processor_task(looper, processor, named_module, target_device):
        task = (getattr(processor, "tasks", None) or {}).get(getattr(named_module, "name", None))
        quantizer = getattr(task, "quantizer", None)
        if not isinstance(quantizer, torch.nn.Module) or target_device is None:
            counters.host("rehome_processor_task", "no quantizer module" if target_device is not None
                          else "no device")
        elif has_meta(quantizer):
            counters.host("rehome_processor_task", "meta (offloaded) tensors")
        elif all(t.device == resolved_device(target_device) for t in quantizer.buffers()):
            counters.host("rehome_processor_task", "already on the device")  # the expert stage moved it
        else:  # GPTQModel's own moves below find the quantizer's tensors in place
            guard.attempt("rehome_processor_task", lambda: ctx.move_module_to_device(quantizer, target_device),
                          lambda: None)
        return original(looper, processor, named_module, target_device)
    return _rehome_processor_task
