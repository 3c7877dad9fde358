"""Stand-in for auto_round.utils.model's to_device: a tensor moved to a device; a dict's values
moved in place; a list or tuple rebuilt (a tuple as a tuple) of its elements moved; anything
else returned as it is. mv_module_from_gpu: a module's tensors to the CPU, meta ones left
where they are."""
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


def mv_module_from_gpu(module):
    device = getattr(module, "device", None)
    if isinstance(device, torch.device) and device.type in ("cpu", "meta"):
        return module
    tensors = list(module.parameters()) + list(module.buffers())
    if not any(t.is_meta for t in tensors):
        return module.to("cpu")
    for child in module.children():
        mv_module_from_gpu(child)
    for name, p in list(module._parameters.items()):
        if p is not None and p.device.type not in ("meta", "cpu"):
            module._parameters[name] = torch.nn.Parameter(p.to("cpu"), requires_grad=p.requires_grad)
    for name, b in list(module._buffers.items()):
        if b is not None and b.device.type not in ("meta", "cpu"):
            module._buffers[name] = b.to("cpu")
    return module
