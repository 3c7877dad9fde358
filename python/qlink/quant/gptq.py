"""GPTQ on qlink's native engine (quant/, behind the C ABI): Hessians accumulated per
device and merged in device order, and layers quantized data-parallel, layers sharing a
Hessian (q/k/v, gate/up) sharing one inverse. Semantics: GPTQModel's GPTQ.quantize."""
import dataclasses

import torch

from .. import _abi, collectives
from ..defaults import default_context
from ..streams import current_streams

# The engine's options and their defaults (GPTQModel's), in one place: gptq_quantize's and
# parallel_gptq's keyword arguments.
DEFAULTS = dict(bits=4, group_size=128, sym=True, desc_act=False, static_groups=False, damp=0.01,
                damp_auto_increment=0.01, nsamples=0, tf32=False, act_group_aware=False,
                inverse="cholesky_inverse")


@dataclasses.dataclass
class GPTQResult:
    codes: torch.Tensor   # uint8 (rows, columns): levels in [0, 2^bits)
    scales: torch.Tensor  # fp32 (rows, groups), in the order the columns were visited (act_group_aware: the groups')
    zeros: torch.Tensor   # fp32 (rows, groups), integer values
    g_idx: torch.Tensor   # int32 (columns): each column's group
    weight: torch.Tensor  # dequantized, the weight's dtype
    loss: float           # sum of (w - q)^2 / d^2 / 2, divided by nsamples when given
    damp: float           # the damp the Hessian's Cholesky succeeded with


@dataclasses.dataclass
class GPTQLayer:
    """One linear layer to quantize. Layers given the same hessian tensor share its inverse.
    device: the qlink device id on the CPU backend (virtual devices share CPU memory)."""
    weight: torch.Tensor
    hessian: torch.Tensor
    name: str = ""
    device: int = None


def inverse_code(inverse):
    """qlink_gptq_inverse's value for `inverse` ("cholesky_inverse" or "triangular");
    ValueError naming the argument otherwise."""
    if inverse not in _abi.GPTQ_INVERSES:
        raise ValueError("inverse must be one of %s, got %r" % (", ".join(_abi.GPTQ_INVERSES), inverse))
    return _abi.GPTQ_INVERSES[inverse]


def _options(**options):
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise TypeError("unknown GPTQ options %s (the options: %s)" % (unknown, ", ".join(DEFAULTS)))
    o = dict(DEFAULTS, **options)
    return {"bits": int(o["bits"]), "group_size": int(o["group_size"]), "sym": int(bool(o["sym"])),
            "desc_act": int(bool(o["desc_act"])), "static_groups": int(bool(o["static_groups"])),
            "tf32": int(bool(o["tf32"])), "damp": float(o["damp"]),
            "damp_auto_increment": float(o["damp_auto_increment"]),
            "nsamples": float(o["nsamples"]), "act_group_aware": int(bool(o["act_group_aware"])),
            "inverse": inverse_code(o["inverse"])}


def group_count(columns, group_size):
    """The groups per row: one for group_size -1 (the engine refuses a group_size that
    does not divide the columns)."""
    return 1 if group_size == -1 else columns // group_size


def _streams(ctx, tensors):
    gpus = {t.device.index for t in tensors if t.device.type == "cuda"}
    return current_streams(ctx, gpus) if gpus and not ctx.cpu_memory else None


def parallel_gptq(layers, placement=None, **options):
    """Quantizes `layers` (GPTQLayer, or (weight, hessian) pairs) together: each Hessian's
    inverse once, layers placed over placement's devices by cost (None: each on its own
    device), a large layer's rows split when devices outnumber layers. Results do not
    depend on the placement. options: those of gptq_quantize (ctx, where given with a
    placement, the placement's own). Returns a GPTQResult per layer, on the layer's device."""
    layers = [layer if isinstance(layer, GPTQLayer) else GPTQLayer(*layer) for layer in layers]
    ctx = options.pop("ctx", None)
    if placement is not None:
        if ctx is not None and ctx is not placement.ctx:
            raise ValueError("ctx: another context than the placement's")
        ctx = placement.ctx
    ctx = ctx or default_context()
    opts = _options(**options)
    results, specs = [], []
    for layer in layers:
        w = layer.weight
        rows, cols = w.shape if w.dim() == 2 else (0, 0)
        r = GPTQResult(torch.empty((rows, cols), dtype=torch.uint8, device=w.device),
                       torch.empty((rows, group_count(cols, opts["group_size"])), dtype=torch.float32, device=w.device),
                       torch.empty((rows, group_count(cols, opts["group_size"])), dtype=torch.float32, device=w.device),
                       torch.empty((cols,), dtype=torch.int32, device=w.device), torch.empty_like(w), 0.0, 0.0)
        results.append(r)
        spec = {"name": layer.name, "weight": w, "hessian": layer.hessian, "codes": r.codes, "scales": r.scales,
                "zeros": r.zeros, "g_idx": r.g_idx, "dequantized": r.weight}
        if layer.device is not None:
            spec["device"] = layer.device
        specs.append(spec)
    devices = placement.ids if placement is not None else None
    tensors = [layer.weight for layer in layers]
    for (loss, damp), r in zip(ctx.gptq_quantize(specs, opts, devices, _streams(ctx, tensors)), results):
        r.loss, r.damp = loss, damp
    return results


def gptq_quantize(weight, hessian, ctx=None, device=None, **options):
    """GPTQ of one layer on its device. weight (rows, columns) fp32/bf16/fp16; hessian
    (columns, columns) fp32 = (2/N) sum X^T X. options (DEFAULTS): bits, group_size (-1:
    one group per row), sym, desc_act, static_groups, damp, damp_auto_increment, nsamples
    (the N behind the Hessian, which divides the reported loss as GPTQModel's avg_loss; 0:
    the undivided sum), tf32, act_group_aware (GPTQModel's group-aware reordering, its
    default without desc_act), inverse (how H^-1's Cholesky factor is made:
    "cholesky_inverse", GPTQModel's calls, or "triangular", a quarter of the flops and
    the same factor to fp32 rounding; qlink.h's qlink_gptq_inverse)."""
    return parallel_gptq([GPTQLayer(weight, hessian, device=device)], None, ctx=ctx, **options)[0]


def parallel_hessian(shards, placement):
    """H = (2/N) sum_r X_r^T X_r on the home rank (rank 0), N the total calibration rows:
    each rank's partial accumulated by qlink on its device, the partials summed in device
    order by qlink.reduce (bit-identical whatever order they arrive in). shards[r]: rank r's
    activations (..., in_features), on rank r's device."""
    ctx = placement.ctx
    cols = shards[0].shape[-1]
    rows = sum(s.numel() // cols for s in shards)
    partials = [torch.zeros((cols, cols), dtype=torch.float32, device=placement.torch_devices[r])
                for r in range(placement.world)]
    ids = placement.device_ids()
    streams = _streams(ctx, partials)
    ctx.hessian_accumulate(shards, partials, ids, ids, streams)
    out = torch.empty_like(partials[0])
    collectives.reduce(partials, out, scale=2.0 / rows, ctx=ctx, input_devices=ids,
                       output_device=None if ids is None else ids[0])
    return out
