"""GPTQModel's calibration cache (the InputCache its input capture returns: every batch's
layer inputs, kwargs, position ids and attention masks) moved once to the GPU the layers
run on.

GPTQModel runs the capture on the CPU and keeps the cache there, so every forward of every
layer (four subset forwards and a replay per decoder layer, a batch at a time) moves the
batch's tensors to the GPU again: layer 0's hidden states five times, the position ids and
rotary tables of every batch for every forward of every layer, each through a pinned twin
the CPU fills (GPTQModel captures under inference_mode, and an inference tensor has no
version counter that would let a twin be kept). With the cache on the GPU those moves find
their tensors already there (GPTQModel's move_to returns them as they are). The cache
holds the same bytes, in tensors made under the same inference mode; nothing else changes.

The cache stays where it is when the forwards may run on several GPUs (GPTQModel spreads
batches over every visible one), when it would take more than half of the GPU's free
memory, and on the host-memory backends."""
import dataclasses

import torch

from ..moves import map_nested, nested_tensors
from ..streams import resolved_device

FREE_SHARE = 0.5  # of the GPU's free memory the cache may take


def _fields(cache):
    return {f.name: getattr(cache, f.name) for f in dataclasses.fields(cache)}


def placement(ctx, quantize_device, cache):
    """(the GPU the cache should move to, None), or (None, why it stays)."""
    if ctx.host_memory:
        return None, "the %s backend computes in host memory" % ctx.backend
    if not dataclasses.is_dataclass(cache) or isinstance(cache, type):
        return None, "a cache of type %s, not GPTQModel's InputCache" % type(cache).__name__
    if torch.cuda.device_count() != 1:
        return None, "%d GPUs visible: GPTQModel may spread the forwards over them" % torch.cuda.device_count()
    try:
        device = torch.device(str(getattr(quantize_device, "value", quantize_device)))
    except (RuntimeError, TypeError):
        return None, "quantize_config.device %r is not a torch device" % (quantize_device,)
    if device.type != "cuda":
        return None, "the layers run on %s" % device
    device = resolved_device(device)
    nbytes = sum(t.numel() * t.element_size() for t in nested_tensors(_fields(cache)) if t.device.type == "cpu")
    if nbytes == 0:
        return None, "nothing of the cache is in host memory"
    free = torch.cuda.mem_get_info(device)[0]
    if nbytes > FREE_SHARE * free:
        return None, "the cache (%.2f GiB) would take more than %d %% of %s's free %.2f GiB" % (
            nbytes / 2 ** 30, 100 * FREE_SHARE, device, free / 2 ** 30)
    return device, None


def _to(tensors, device):
    return [t.to(device) for t in tensors]


def on_device(cache, device):
    """A new cache of the same type with every tensor on `device` (one the cache holds
    twice, moved once, as move_nested_to_device moves it). Moved once, before the
    first layer, with the GPU idle: PyTorch's pageable copies (the driver streams them
    through its own pinned buffers) beat pinned twins here, which would page-lock the whole
    cache anew (measured: 2.7 GB in 2.1 s through twins)."""
    return dataclasses.replace(cache, **map_nested(_fields(cache), lambda tensors: _to(tensors, device)))
