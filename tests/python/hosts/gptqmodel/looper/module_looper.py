"""Stand-in for gptqmodel.looper.module_looper: imports the helpers by name."""
from ..utils.looper_helpers import clone_module_for_devices
from ..utils.model import move_to


class ModuleLooper:
    def replicate_layer(self, layer, devices):
        return clone_module_for_devices(layer, devices)

    def stage(self, tensor, device):
        return move_to(tensor, device)
