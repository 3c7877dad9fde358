"""GPTQModel's tensor, module and calibration moves (gptqmodel.utils.model's move_to and
nested_move_to) through qlink's moves: CPU tensors reach the GPU through pinned twins
on the device's current stream (qlink/pinned_staging.py), no thread blocked; what the
moves do not take (dtype conversions, meta tensors, other objects) stays GPTQModel's."""
import torch

from ...moves import has_meta
from ..patches import like


def make_move_to(installation, original):
    ctx, counters, guard = installation.ctx, installation.counters, installation.guard

    @like(original)
    def move_to(obj, device, dtype=None):
        if dtype is not None:
            reason = "a dtype conversion"
        elif device is None:
            reason = "no device"
        elif isinstance(obj, torch.nn.Module):
            reason = "meta (offloaded) tensors" if has_meta(obj) else None
        else:
            reason = None if isinstance(obj, torch.Tensor) else "a %s, not a tensor" % type(obj).__name__
        if reason:
            counters.host("move_to", reason)
            return original(obj, device, dtype)
        if isinstance(obj, torch.nn.Module):  # changed only once every tensor has arrived (moves.py)
            return guard.attempt("move_to", lambda: ctx.move_module_to_device(obj, device),
                                 lambda: original(obj, device, dtype))
        # A tensor moved alone is calibration data (masks, position ids): moved again
        # for every subset of every layer, so its pinned twin is kept.
        return guard.attempt("move_to", lambda: ctx.move_tensors([obj], device, keep_host_copies=True)[0],
                             lambda: original(obj, device, dtype))
    return move_to


def make_nested_move_to(installation, original):
    ctx, counters, guard = installation.ctx, installation.counters, installation.guard

    @like(original)
    def nested_move_to(v, device, dtype=None):
        if dtype is not None or device is None:
            counters.host("nested_move_to", "a dtype conversion" if dtype is not None else "no device")
            return original(v, device, dtype)
        return guard.attempt("nested_move_to",
                             lambda: ctx.move_nested_to_device(v, device, keep_host_copies=True),
                             lambda: original(v, device, dtype))
    return nested_move_to
