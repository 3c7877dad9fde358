"""Stand-in for gptqmodel.looper.gptq_processor: the processor whose hooks feed GPTQ, and
the module-level GPTQ it builds its tasks from (GPTQModel's preprocess calls GPTQ(...));
its tasks keyed by module name; pre_process_fwd_hook, the hook that feeds a module's task
its input (the output goes to add_batch, which reads the input alone); process(), which
solves a module's task and writes the quantized weight back, as the host's does before the
next subset's forwards; and
submodule_finalize, which puts the quantized linear in the model and packs it, finding both
by walks of the whole model as the host's does."""
import torch

from ..nn_modules.qlinear import PackableQuantLinear
from ..quantization.config import QuantizeConfig
from ..quantization.gptq import GPTQ  # noqa: F401 (the name the processor builds its tasks from)
from ..utils.model import create_quant_module, find_modules, pack_module


class GPTQProcessor:
    def __init__(self, qcfg=None):
        self.qcfg, self.tasks, self.results = qcfg or QuantizeConfig(), {}, {}

    def preprocess(self, named_module):
        task = self.tasks[named_module.name] = GPTQ(named_module.module, self.qcfg)
        task.name = named_module.name
        return task

    def pre_process_fwd_hook(self, name):
        def tmp(module, inp, out):
            self.tasks[name].add_batch(inp[0].data, out.data)
        return tmp

    def process(self, module):
        task = self.tasks[module.name]
        with torch.inference_mode():
            result = self.results[module.name] = task.quantize()
            module.module.weight.data = result[0]

    def submodule_finalize(self, module, model, **kwargs):
        q_scales, q_zeros, q_g_idx = self.results[module.name][1:4]
        layers = find_modules(model.model)
        create_quant_module(name=module.full_name, bits=self.qcfg.bits, module=model.model)
        qModules = {name: submodule for name, submodule in find_modules(model.model, [PackableQuantLinear]).items()
                    if name == module.full_name}
        pack_module(name=module.full_name, qModules=qModules, q_scales=q_scales, q_zeros=q_zeros, q_g_idx=q_g_idx,
                    layers=layers)
