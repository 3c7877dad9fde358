"""Stand-in for auto_round.utils.model's to_device: a tensor moved to a device; a dict's values
moved in place; a list or tuple rebuilt (a tuple as a tuple) of its elements moved; anything
else returned as it is."""
import torch


def to_device(input, device=torch.device("cpu")):
    if isinstance(input, torch.Tensor):
        return input.to(device)
    if isinstance(input, dict):
        for key in input:
            input[key] = to_device(input[key], device)
        return input
    if isinstance(input, (list, tuple)) and input:
        moved = [to_device(item, device) for item in input]
        return tuple(moved) if isinstance(input, tuple) else moved
    return input
