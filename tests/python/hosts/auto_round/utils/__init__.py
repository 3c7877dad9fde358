"""Stand-in for auto_round.utils: module lookup by dotted name, the layer types AutoRound wraps,
to_device (auto_round.utils.model's, which AutoRound's modules import by name from here)."""
import functools

import torch

from . import device_manager  # noqa: F401
from .model import to_device  # noqa: F401


def get_module(model, name):
    return functools.reduce(getattr, name.split("."), model) if name else model


def set_module(model, name, module):
    parent, _, child = name.rpartition(".")
    setattr(get_module(model, parent), child, module)


SUPPORTED_LAYER_TYPES = (torch.nn.Linear,)
