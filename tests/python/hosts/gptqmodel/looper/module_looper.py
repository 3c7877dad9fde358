"""Stand-in for gptqmodel.looper.module_looper: imports the helpers by name; cache_inputs
returns what `capture` (a test's function of the looper) makes, under inference_mode as
GPTQModel's loop runs it, called by keyword as the host calls it; the looper's processors,
MoE routing options and the model's batching flag as GPTQModel's __init__ sets them;
_rehome_processor_task moves a module's task state (its quantizer) to the module's device
with Module.to, as GPTQModel's does before each subset's forwards."""
import torch

from ..utils.looper_helpers import clone_module_for_devices
from ..utils.model import move_to


class ModuleLooper:
    def __init__(self, gptq_model=None, capture=None, processors=(), layers=()):
        self.gptq_model, self.capture, self.processors, self.layers = gptq_model, capture, list(processors), layers
        self.support_batch_quantize = getattr(gptq_model, "support_batch_quantize", False)
        self.moe_routing_override, self.moe_routing_bypass = None, False

    def replicate_layer(self, layer, devices):
        return clone_module_for_devices(layer, devices)

    def stage(self, tensor, device):
        return move_to(tensor, device)

    def cache_inputs(self, layers, calibration_data, use_cache, layer_names=None):
        return self.capture(calibration_data)

    def _rehome_processor_task(self, processor, named_module, target_device):
        task = (getattr(processor, "tasks", None) or {}).get(named_module.name)
        quantizer = getattr(task, "quantizer", None)
        if quantizer is not None and hasattr(quantizer, "to"):
            quantizer.to(target_device)

    def loop(self, calibration_data):
        with torch.inference_mode():
            return self.cache_inputs(layers=self.layers, calibration_data=calibration_data, use_cache=False)
