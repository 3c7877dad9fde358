"""Stand-in for gptqmodel.looper.module_looper: imports the helpers by name; cache_inputs
returns what `capture` (a test's function of the looper) makes, under inference_mode as
GPTQModel's loop runs it, called by keyword as the host calls it; the looper's processors,
MoE routing options, quantization devices (the CPU: no GPU here) and the model's batching
flag as GPTQModel's __init__ sets them;
_rehome_processor_task moves a module's task state (its quantizer) to the module's device
with Module.to, as GPTQModel's does before each subset's forwards;
_prepare_named_module_for_forward fills a subset module on its device (GPTQModel's from the
checkpoint, here a move); _masked_hook_wrapper wraps a processor's hook as GPTQModel's
subset forwards do (its keep masks are GPTQModel's alone: none here); hessians() walks the
layers as the loop does up to each task's merged Hessian."""
import torch

from ..utils.looper_helpers import clone_module_for_devices
from ..utils.model import move_to


class ModuleLooper:
    def __init__(self, gptq_model=None, capture=None, processors=(), layers=()):
        self.gptq_model, self.capture, self.processors, self.layers = gptq_model, capture, list(processors), layers
        self.support_batch_quantize = getattr(gptq_model, "support_batch_quantize", False)
        self.moe_routing_override, self.moe_routing_bypass = None, False
        self._quant_devices = [torch.device("cpu")]

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

    def _prepare_named_module_for_forward(self, named_module, fallback_device):
        named_module.module.to(fallback_device)
        return named_module.module

    def _masked_hook_wrapper(self, processor, inner_hook, hook_source):
        def hook(module, inputs, output):
            return inner_hook(module, inputs, output)
        return hook

    def loop(self, calibration_data):
        with torch.inference_mode():
            return self.cache_inputs(layers=self.layers, calibration_data=calibration_data, use_cache=False)

    def hessians(self, calibration_data):
        """The loop's walk over self.layers up to the solve: the cache captured (cache_inputs,
        under inference_mode), then per layer a GPTQ task per Linear (named
        "<layer>.<module path>"), a forward hook feeding it (inp[0].data, out.data,
        batch_index) as GPTQProcessor's hook does, every batch's forward with the kwargs
        ForwardExecutor gives it (attention_mask and position_ids where the cache holds them,
        then the batch's layer_input_kwargs), each task's Hessian merged (finalize_hessian) and
        the layer's outputs the next layer's inputs. Returns {name: the finished task}."""
        from ..quantization.config import QuantizeConfig
        from . import gptq_processor  # the name GPTQModel's processor builds its tasks from
        tasks = {}
        with torch.inference_mode():
            cache = self.cache_inputs(layers=self.layers, calibration_data=calibration_data, use_cache=False)
            inputs = cache.layer_inputs
            for index, layer in enumerate(self.layers):
                handles, mine = [], {}
                for path, module in layer.named_modules():
                    if isinstance(module, torch.nn.Linear):
                        task = mine["%d.%s" % (index, path)] = gptq_processor.GPTQ(module, QuantizeConfig())
                        task.name = "%d.%s" % (index, path)
                        handles.append(module.register_forward_hook(
                            lambda m, inp, out, task=task: task.add_batch(inp[0].data, out.data,
                                                                          batch_index=self._batch)))
                outputs = []
                try:
                    for self._batch, layer_input in enumerate(inputs):
                        kwargs = {}
                        if cache.attention_masks[self._batch] is not None:
                            kwargs["attention_mask"] = cache.attention_masks[self._batch]
                        if cache.position_ids:
                            kwargs["position_ids"] = cache.position_ids[self._batch]
                        kwargs.update(cache.layer_input_kwargs[self._batch])
                        out = layer(*layer_input, **kwargs)
                        outputs.append([out if isinstance(out, torch.Tensor) else out[0]])
                finally:
                    for handle in handles:
                        handle.remove()
                for task in mine.values():
                    task.finalize_hessian()
                tasks.update(mine)
                inputs = outputs
        return tasks
