"""Stand-in for gptqmodel.utils.looper_helpers: replicas by torch.nn.parallel.replicate,
errors swallowed into a deepcopy per device (as the host does), and the forward worker
that stages a batch with move_to / nested_move_to."""
import copy

import torch

from .model import move_to, nested_move_to


def clear_non_picklable_state(module):
    return []


def torch_replicate(module, devices, detach=True):
    return torch.nn.parallel.replicate(module, devices, detach=detach)


def clone_module_for_devices(module, devices, *, clear_state_fn=clear_non_picklable_state, progress_callback=None):
    """As the host's: the module staged (eval, its state cleared) and announced, replicas by
    torch_replicate or, if that raises, a deepcopy per device; each replica cleared and
    announced. A failing progress callback is ignored, as the host ignores it."""
    def notify(index, device, step):
        try:
            if progress_callback is not None:
                progress_callback(index, len(devices), device, step)
        except Exception:  # noqa: BLE001 (the host logs it at debug level)
            pass

    clones = {}
    module.eval()
    clear_state_fn(module)
    notify(0, devices[0], "stage")
    try:
        replicas = torch_replicate(module, devices)
    except Exception:  # the host logs at info level and falls back
        replicas = [copy.deepcopy(module).to(d) for d in devices]
    for i, (device, replica) in enumerate(zip(devices, replicas), start=1):
        replica.eval()
        clear_state_fn(replica)
        replica._gptqmodule_device_hint = device
        clones[device] = replica
        notify(i, device, "replica")
    return clones


def forward_batch_worker(module, layer_input, layer_input_kwargs):
    device = module._gptqmodule_device_hint
    inputs = [move_to(x, device=device) for x in layer_input]
    kwargs = {k: nested_move_to(v, device=device) for k, v in layer_input_kwargs.items()}
    return module(*inputs, **kwargs)
