"""Stand-in for auto_round.utils: module lookup by dotted name, the layer types AutoRound wraps,
which of them it quantizes, the conversion of a pre-quantized layer, to_device
(auto_round.utils.model's, which AutoRound's modules import by name from here)."""
import functools

import torch

from . import device_manager  # noqa: F401
from .model import mv_module_from_gpu, to_device  # noqa: F401


def get_module(model, name):
    return functools.reduce(getattr, name.split("."), model) if name else model


def set_module(model, name, module):
    parent, _, child = name.rpartition(".")
    setattr(get_module(model, parent), child, module)


SUPPORTED_LAYER_TYPES = (torch.nn.Linear,)


def check_to_quantized(m):
    return getattr(m, "bits", 16) <= 8 or getattr(m, "act_bits", 16) <= 8


def convert_module_to_hp_if_necessary(layer, dtype=torch.bfloat16, device="cpu", to_cpu=False):
    """A new bf16 Linear of a layer loaded pre-quantized (quantized_weight_type set), else the layer."""
    if getattr(layer, "quantized_weight_type", None) is None:
        return layer
    new = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, dtype=dtype,
                          device=device)
    new.global_name = layer.global_name
    return new
