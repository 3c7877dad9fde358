"""GPTQModel's replicas of a layer for its forward workers (looper_helpers'
clone_module_for_devices and torch_replicate): qlink's broadcast, not
torch.nn.parallel.replicate; GPTQModel's steps around it (eval, clear, device hints) in
its order."""
import torch

from ..patches import like
from .contract import replica_ready


def make_torch_replicate(installation, original):
    ctx, guard = installation.ctx, installation.guard

    @like(original)
    def torch_replicate(module, devices, detach=True):
        return guard.attempt("torch_replicate",
                             lambda: list(ctx.clone_module_for_devices(module, devices).values()),
                             lambda: original(module, devices, detach=detach))
    return torch_replicate


def make_clone_module_for_devices(installation, original):
    h, counters = installation.host, installation.counters

    @like(original)
    def clone_module_for_devices(module, devices, *, clear_state_fn=None, progress_callback=None):
        clear = clear_state_fn or h.helpers.clear_non_picklable_state

        def host():
            return original(module, devices, clear_state_fn=clear, progress_callback=progress_callback)

        if not devices or all(torch.device(d).type == "cpu" for d in devices):
            counters.host("clone_module_for_devices", "CPU devices: P2P is an accelerator concept")
            return host()

        def notify(index, device, step):  # GPTQModel ignores a failing progress callback
            try:
                if progress_callback is not None:
                    progress_callback(index, len(devices), device, step)
            except Exception:  # noqa: BLE001
                pass

        # GPTQModel's steps, in its order. Its callbacks (clear) run once each and what
        # they raise is theirs; the replicas are the one step of qlink's, through the
        # host's torch_replicate binding (the patch below: qlink's replicas, or the
        # host's replicate if qlink's fail, before anything else is redone).
        module.eval()
        clear(module)
        notify(0, devices[0], "stage")
        replicas, out = h.helpers.torch_replicate(module, devices), {}
        for i, (device, replica) in enumerate(zip(devices, replicas), start=1):
            replica_ready(replica, device, clear)
            out[device] = replica
            notify(i, device, "replica")
        counters.qlink("clone_module_for_devices")
        return out
    return clone_module_for_devices
