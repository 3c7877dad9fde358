"""Stand-in for gptqmodel.looper.gptq_processor: the processor whose hooks feed GPTQ, and
the module-level GPTQ it builds its tasks from (GPTQModel's preprocess calls GPTQ(...));
its tasks keyed by module name, and process(), which solves a module's task and writes the
quantized weight back, as the host's does before the next subset's forwards."""
import torch

from ..quantization.config import QuantizeConfig
from ..quantization.gptq import GPTQ  # noqa: F401 (the name the processor builds its tasks from)


class GPTQProcessor:
    def __init__(self, qcfg=None):
        self.qcfg, self.tasks, self.results = qcfg or QuantizeConfig(), {}, {}

    def preprocess(self, named_module):
        task = self.tasks[named_module.name] = GPTQ(named_module.module, self.qcfg)
        task.name = named_module.name
        return task

    def process(self, module):
        task = self.tasks[module.name]
        with torch.inference_mode():
            result = self.results[module.name] = task.quantize()
            module.module.weight.data = result[0]
