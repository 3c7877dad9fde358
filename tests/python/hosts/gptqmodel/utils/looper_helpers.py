"""Stand-in for gptqmodel.utils.looper_helpers: replicas by torch.nn.parallel.replicate,
errors swallowed into a deepcopy per device (as the host does), and the forward worker
that stages a batch with move_to / nested_move_to."""
import copy

import torch

from .model import move_to, nested_move_to

CLONE_LOG = []  # which way each clone went: "replicate" or "deepcopy"


def clear_non_picklable_state(module):
    return []


def torch_replicate(module, devices, detach=True):
    return torch.nn.parallel.replicate(module, devices, detach=detach)


def clone_module_for_devices(module, devices, *, clear_state_fn=clear_non_picklable_state, progress_callback=None):
    clones = {}
    try:
        replicas = torch_replicate(module, devices)
        CLONE_LOG.append("replicate")
    except Exception:  # the host logs at info level and falls back
        replicas = [copy.deepcopy(module).to(d) for d in devices]
        CLONE_LOG.append("deepcopy")
    for device, replica in zip(devices, replicas):
        clear_state_fn(replica)
        replica._gptqmodule_device_hint = device
        clones[device] = replica
    return clones


def forward_batch_worker(module, layer_input, layer_input_kwargs):
    device = module._gptqmodule_device_hint
    inputs = [move_to(x, device=device) for x in layer_input]
    kwargs = {k: nested_move_to(v, device=device) for k, v in layer_input_kwargs.items()}
    return module(*inputs, **kwargs)
