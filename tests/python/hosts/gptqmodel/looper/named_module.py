"""Stand-in for gptqmodel.looper.named_module.NamedModule: a layer's module with its name
in the layer (`name`, what subsets and the processor's tasks are keyed by) and in the
model (`full_name`), and its work state (`state`: GPTQModel's preferred_quant_device hint
among it)."""
import torch


class NamedModule(torch.nn.Module):
    def __init__(self, module, name, full_name, layer_index):
        super().__init__()
        self.module, self.name, self.full_name, self.layer_index = module, name, full_name, layer_index
        self.state = {}

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
