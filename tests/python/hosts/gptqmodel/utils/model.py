"""Stand-in for gptqmodel.utils.model: move_to and nested_move_to by Tensor.to / Module.to."""
import torch


def move_to(obj, device, dtype=None):
    if getattr(obj, "device", None) != torch.device(device) or dtype is not None:
        obj = obj.to(device=device, dtype=dtype)
    return obj


def nested_move_to(v, device, dtype=None):
    if isinstance(v, torch.Tensor):
        return move_to(v, device=device, dtype=dtype)
    if isinstance(v, dict):
        return {k: nested_move_to(x, device=device, dtype=dtype) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(nested_move_to(x, device=device, dtype=dtype) for x in v)
    return v
