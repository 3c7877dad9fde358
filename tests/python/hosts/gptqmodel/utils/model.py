"""Stand-in for gptqmodel.utils.model: move_to and nested_move_to by Tensor.to / Module.to;
find_modules, the host's walk of a model (a module of the looked-for types ends a branch,
keys the dotted path); create_quant_module, which puts a quantized linear where a layer's
linear was; pack_module, which packs the one entry of both walks' results it is named."""
import torch
from torch import nn

from ..nn_modules.qlinear import PackableQuantLinear

SUPPORTS_MODULE_TYPES = [nn.Embedding, nn.Linear]


def move_to(obj, device, dtype=None):
    if getattr(obj, "device", None) != torch.device(device) or dtype is not None:
        obj = obj.to(device=device, dtype=dtype)
    return obj


def nested_move_to(v, device, dtype=None):
    if isinstance(v, torch.Tensor):
        return move_to(v, device=device, dtype=dtype)
    if isinstance(v, dict):
        return {k: nested_move_to(x, device=device, dtype=dtype) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(nested_move_to(x, device=device, dtype=dtype) for x in v)
    return v


def find_modules(module, layers=None, name=""):
    if not layers:
        layers = SUPPORTS_MODULE_TYPES
    if isinstance(module, tuple(layers)):
        return {name: module}
    res = {}
    for child_name, child in module.named_children():
        res.update(find_modules(child, layers=layers, name=name + "." + child_name if name != "" else child_name))
    return res


def create_quant_module(name, bits, module):
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    linear = getattr(parent, child)
    setattr(parent, child, PackableQuantLinear(bits, linear.in_features, linear.out_features, name=name))


def pack_module(name, qModules, q_scales, q_zeros, q_g_idx, layers):
    qModules[name].pack_block(layers[name], q_scales, q_zeros, q_g_idx)
