"""AutoRound's unwrap of a block's same-shaped quantized layers (a projection's experts) in
one call of its own WrapperLinear: the layers' weight rows stacked into one stand-in linear
(the proxy) with their common attributes, wrapped and unwrapped with their best parameters
stacked the same way; then each layer takes its rows of the result and of every attribute
the unwrap set (scale, zp, iters). AutoRound wraps and unwraps each of a Qwen3-30B-A3B
block's 384 expert linears on its own, tens of small GPU operations and two copies to the
CPU each, at iters=0 (its RTN) and at the end of every tuned block.

Invariant: each layer ends as its own unwrap leaves it, bit for bit, where
contract.row_stacking_refusal finds nothing (the unwrap works group by group within a row)
and the layer holds no state but plain values and the per-layer ones (its name, tuning
device, imatrix, which the int unwraps ignore); any other layer is unwrapped on its own,
and a group whose unwrap sets anything else writes nothing (UngroupedLayers)."""
import collections

import torch

from ...quant.placement import shard_sizes
from .contract import row_stacking_refusal

MAX_ELEMENTS = 1 << 26  # a call's stacked weight elements: AutoRound's qdq makes fp32 copies of them
_PER_LAYER = frozenset({"global_name", "tuning_device", "imatrix", "imatrix_cnt", "iters", "scale", "zp"})
_PLAIN = (bool, int, float, str, type(None), torch.dtype)
_WRITES = frozenset({"scale", "zp", "iters"})  # what the unwrap sets on a stacked layer
_TORCH_STATE = frozenset(vars(torch.nn.Linear(1, 1, bias=False, device="meta")))


class UngroupedLayers(ValueError):
    """A group's unwrap did what stacked layers cannot share; nothing of theirs was written."""


def _own_state(layer):
    """The attributes AutoRound (and the user) set on the layer, not torch's own."""
    return {k: v for k, v in vars(layer).items() if k not in _TORCH_STATE}


def worth_stacking(device):
    """Whether stacking pays on `device`: on a GPU each layer's unwrap is tens of launches and
    two copies to the CPU, stacked one; on the CPU the stacked copies cost more than that
    (bench/hosts/check_unwrap.py)."""
    return torch.device(device).type != "cpu"


def group_key(layer, device):
    """(key, None) where `layer` may be unwrapped on `device` stacked with the layers of an
    equal key, else (None, why not)."""
    if not worth_stacking(device):
        return None, "on the CPU (one by one is faster there)"
    state = _own_state(layer)
    params = list(layer.parameters())
    if type(layer) is not torch.nn.Linear or hasattr(layer, "update") or hasattr(layer, "get_weight"):
        return None, "a %s of its own weight handling" % type(layer).__name__
    if any(p.device != device for p in params):
        return None, "weights not on %s" % device
    why = row_stacking_refusal(state, tuple(layer.weight.shape))
    if why:
        return None, why
    shared = []
    for key in sorted(set(state) - _PER_LAYER):
        if not isinstance(state[key], _PLAIN):
            return None, "its attribute %r is a %s" % (key, type(state[key]).__name__)
        shared.append((key, state[key]))
    return (tuple(layer.weight.shape), layer.weight.dtype, layer.bias is not None, str(device), tuple(shared)), None


def groups(layers):
    """layers: [(name, layer, device)]. ([[(name, layer)] of one key, two or more, in the
    given order, each within MAX_ELEMENTS], {name: why it is unwrapped on its own})."""
    by_key, alone = collections.OrderedDict(), {}
    for name, layer, device in layers:
        key, why = group_key(layer, device)
        if key is None:
            alone[name] = why
        else:
            by_key.setdefault(key, []).append((name, layer))
    out = []
    for members in by_key.values():
        if len(members) < 2:
            alone[members[0][0]] = "no other layer of its shape and options"
            continue
        # As few calls as MAX_ELEMENTS allows, of sizes at most one apart: few stacked shapes,
        # so AutoRound's compiled quant-dequant (torch.compile, its default on CUDA) compiles few.
        calls = -(-len(members) // max(1, MAX_ELEMENTS // members[0][1].weight.numel()))
        at = 0
        for take in shard_sizes(len(members), calls):
            out.append(members[at:at + take])
            at += take
    return out, alone


def _stacked_params(params):
    """One layer's best parameters from each layer's ({key: tensor} or None, all with the
    same keys): each key's tensors stacked along their groups; None where there are none."""
    keys = {tuple(sorted(p)) if p else () for p in params}
    if len(keys) != 1:
        raise UngroupedLayers("the layers' best parameters differ in their keys: %s" % sorted(keys))
    names = keys.pop()
    return {k: torch.cat([p[k] for p in params]) for k in names} if names else None


def unwrap(wrapper_class, layers, params, **wrapper_kwargs):
    """AutoRound's `wrapper_class(layer, **wrapper_kwargs).unwrapper(best)` of each of
    `layers` (one group of groups()), `best` its entry of `params`, in one call: the layers
    are changed in place, as each one's own unwrap changes the layer it returns."""
    if wrapper_kwargs.get("iters", 200) == 0 and not wrapper_kwargs.get("disable_opt_rtn", True):
        raise ValueError("optimized RTN searches each layer's scales on its own imatrix: not stackable")
    first, count = layers[0], len(layers)
    rows = first.weight.shape[0]
    proxy = torch.nn.Linear(first.weight.shape[1], rows * count, bias=False, device="meta")
    proxy.weight = torch.nn.Parameter(torch.cat([layer.weight.detach() for layer in layers]), requires_grad=False)
    for key, value in _own_state(first).items():
        if key not in _PER_LAYER:
            setattr(proxy, key, value)
    before = _own_state(proxy)
    out = wrapper_class(proxy, **wrapper_kwargs).unwrapper(_stacked_params(params))
    if out is not proxy:
        raise UngroupedLayers("the unwrap returned a %s, not the layer" % type(out).__name__)
    written = {k: v for k, v in _own_state(proxy).items() if k not in before or v is not before[k]}
    if not set(written) <= _WRITES:
        raise UngroupedLayers("the unwrap set %s" % sorted(set(written) - _WRITES))
    for key, value in written.items():
        if torch.is_tensor(value) and (value.dim() != 2 or value.shape[0] != rows * count):
            raise UngroupedLayers("the unwrap's %s has shape %s, not a row a weight row" % (key, tuple(value.shape)))
    with torch.no_grad():
        for i, layer in enumerate(layers):
            layer.weight.data.copy_(proxy.weight[i * rows:(i + 1) * rows])
            layer.weight.grad = None
            for key, value in written.items():
                setattr(layer, key, value[i * rows:(i + 1) * rows].clone() if torch.is_tensor(value) else value)
