"""The Context's calls into qlink's native quantization engines: Hessian accumulation and
GPTQ (ABI 1.4), SignRound's quant-dequant, its backward and SignSGD's step (ABI 1.7), for a block's
experts in one call each (ABI 1.10);
qlink.quant builds on them."""
import ctypes

from . import _abi
from ._dlpack import TensorArray, _dtype_of
from .errors import InvalidArgumentError

_GPTQ_TENSORS = ("weight", "hessian", "codes", "scales", "zeros", "g_idx", "dequantized")
_SIGNROUND_TENSORS = ("weight", "v", "min_scale", "max_scale", "qdq", "grad_qdq", "grad_v", "grad_min_scale",
                      "grad_max_scale", "best_v")
_STEP_TENSORS = ("step_lrs", "loss", "best_loss")
_SIGNSGD_TENSORS = ("param", "grad", "best")


def _described(records, fields):
    """One TensorArray of every tensor the records (dicts by field name, with an optional
    "device": the qlink device id where the tensors do not say, or such ids by field) hold,
    and per record and field the address of its DLTensor (None where the field is absent).
    The array owns the descriptors: keep it alive for the call."""
    tensors, ids, where = [], [], []
    for record in records:
        device = record.get("device")
        for field in fields:
            t = record.get(field)
            where.append(None if t is None else len(tensors))
            if t is not None:
                tensors.append(t)
                d = device.get(field) if isinstance(device, dict) else device
                ids.append(d if d is not None else t.device.index or 0)
    array = TensorArray(tensors, ids)
    base, size = ctypes.addressof(array.array), ctypes.sizeof(_abi.DLTensor)
    addresses = [[None if k is None else base + k * size for k in where[i * len(fields):(i + 1) * len(fields)]]
                 for i in range(len(records))]
    return array, addresses


def _layer_specs(layers, fields, spec_type):
    """The ABI layer structs (spec_type) of `layers` (dicts of `fields` by name, an optional
    "name" and "device"), each sized and named, its tensor fields pointing into the
    returned TensorArray. Keep the whole (array, names, specs) alive for the call."""
    array, addresses = _described(layers, fields)
    specs = (spec_type * max(len(layers), 1))()
    names = [str(layer.get("name") or "").encode() for layer in layers]
    for i, spec in enumerate(specs[:len(layers)]):
        spec.struct_size = ctypes.sizeof(spec_type)
        spec.name = names[i] or None
        for field, address in zip(fields, addresses[i]):
            setattr(spec, field, address)
    return array, names, specs


class EngineCalls:
    """The native engine; part of Context."""

    def hessian_accumulate(self, inputs, partials, input_devices=None, partial_devices=None, streams=None,
                           precision=None, input_partials=None):
        """partials[d] += X^T X (fp32, both triangles) for every input X (..., columns) on
        partial d's device (qlink_hessian_args); stream-ordered, like a copy. *_devices:
        qlink device ids where the tensors do not say (the CPU backend's virtual devices).
        precision: "ieee_fp32", "tensor" (bf16/fp16 products on tensor cores, on CUDA their
        sums promoted into fp32 with IEEE adds every 32 rows; fp32 inputs stay IEEE),
        "tensor_gemm" (the vendor's GemmEx on CUDA too, 2048 rows a call; ABI 1.11) or None,
        the config's hessian_precision (ABI 1.6). input_partials: per input, the index in
        partials of its partial (any number per device; ABI 1.8), or None."""
        code = _abi.HESSIAN_PRECISIONS.get("default" if precision is None else precision)
        if code is None or precision == "default":
            raise InvalidArgumentError(_abi.INVALID_ARGUMENT, "precision = %r is not one of None, %s" % (
                precision, ", ".join(repr(p) for p in _abi.HESSIAN_PRECISIONS if p != "default")))
        named = None
        if input_partials is not None:
            if len(input_partials) != len(inputs):
                raise InvalidArgumentError(_abi.INVALID_ARGUMENT, "input_partials has %d entries for %d inputs" % (
                    len(input_partials), len(inputs)))
            named = (ctypes.c_int32 * max(len(inputs), 1))(*[int(k) for k in input_partials])
        src, dst = TensorArray(inputs, input_devices), TensorArray(partials, partial_devices)
        args = _abi.HessianArgs(ctypes.sizeof(_abi.HessianArgs), ctypes.addressof(src.array), len(inputs),
                                ctypes.addressof(dst.array), len(partials), *self.stream_list(streams), code,
                                named)
        self.invoke("hessian_accumulate", ctypes.byref(args))

    def gptq_quantize(self, layers, options, devices=None, streams=None):
        """Quantizes layers (qlink_gptq_args): each a dict of the _GPTQ_TENSORS (outputs may be
        None), an optional "name" and "device" (qlink device id where the tensors do not say);
        options: the qlink_gptq_options fields by name. devices: where the solve may run (None:
        each layer on its own device). Writes the outputs; returns (loss, damp) per layer."""
        array, names, specs = _layer_specs(layers, _GPTQ_TENSORS, _abi.GptqLayer)
        o = _abi.GptqOptions(ctypes.sizeof(_abi.GptqOptions), **options)
        device_list = [int(d) for d in devices or []]
        device_array = (ctypes.c_int32 * max(len(device_list), 1))(*device_list)
        args = _abi.GptqArgs(ctypes.sizeof(_abi.GptqArgs), ctypes.pointer(o), specs, len(layers),
                             device_array if device_list else None, len(device_list), *self.stream_list(streams))
        self.invoke("gptq_quantize", ctypes.byref(args))
        return [(spec.loss, spec.damp) for spec in specs[:len(layers)]]

    def signround_qdq(self, layers, options, backward=False, streams=None, step=None):
        """SignRound's quant-dequant of every layer (qlink_signround_args), or its backward:
        layers are dicts of the _SIGNROUND_TENSORS by field name (absent: NULL), an optional
        "name", "device" and "lr_group"; options: the qlink_signround_options fields by name,
        scale_dtype a torch dtype. step (the backward, ABI 1.9): {"step_lrs", and optionally
        "loss" and "best_loss"} tensors, each layer's v then taking SignSGD's step in place of
        a grad_v. Stream-ordered: enqueued on each layer's device stream."""
        keep, args = self._signround_args(layers, options, streams, step)
        self.invoke("signround_qdq_backward" if backward else "signround_qdq", ctypes.byref(args))

    def signround_experts_qdq(self, layers, options, tokens=None, backward=False, streams=None, step=None):
        """signround_qdq of a block's experts (ABI 1.10): layers as signround_qdq takes them,
        one shape, dtype and device, in one call per pass (one launch on a GPU). tokens: None
        or an (experts,) int32 / int64 tensor on their device, each expert's routed tokens;
        an expert with 0 is skipped (nothing of it written but its best_v)."""
        keep, args = self._signround_args(layers, options, streams, step)
        device = layers[0].get("device") if layers else None
        tokens_array, (tokens_at,) = _described([{"tokens": tokens, "device": device}], ("tokens",))
        experts = _abi.SignRoundExpertsArgs(ctypes.sizeof(_abi.SignRoundExpertsArgs), ctypes.pointer(args), *tokens_at)
        self.invoke("signround_experts_qdq_backward" if backward else "signround_experts_qdq", ctypes.byref(experts))

    def _signround_args(self, layers, options, streams, step):
        """The qlink_signround_args of signround_qdq's arguments, and what must outlive it."""
        array, names, specs = _layer_specs(layers, _SIGNROUND_TENSORS, _abi.SignRoundLayer)
        for spec, layer in zip(specs, layers):
            spec.lr_group = int(layer.get("lr_group", 0))
        record = dict(step or {})
        if step and layers and layers[0].get("device") is not None:  # the layers' virtual device
            record["device"] = layers[0]["device"]
        step_array, (step_at,) = _described([record], _STEP_TENSORS)
        o = _abi.SignRoundOptions(ctypes.sizeof(_abi.SignRoundOptions), int(options["bits"]),
                                  int(options["group_size"]), int(bool(options["sym"])))
        o.scale_dtype.code, o.scale_dtype.bits = _dtype_of(options["scale_dtype"])
        o.scale_dtype.lanes = 1
        o.q_scale_thresh = float(options["q_scale_thresh"])
        args = _abi.SignRoundArgs(ctypes.sizeof(_abi.SignRoundArgs), ctypes.pointer(o), specs, len(layers),
                                  *self.stream_list(streams), *step_at)
        return (array, names, specs, step_array, o), args

    def signsgd_step(self, params, lrs, epoch=None, total_iters=0, loss=None, best_loss=None, streams=None,
                     device=None):
        """One SignSGD step of one device's parameters (qlink_signsgd_args): params are dicts
        of "param", "grad", optional "best" and "lr_group" (an index into lrs, a (groups,)
        fp32 tensor); epoch ((1,) int64) with total_iters advances LinearLR's schedule; loss
        and best_loss ((1,) fp32) keep the best parameters. device: the qlink device id where
        the tensors do not say."""
        keep, args = self._signsgd_args(params, lrs, epoch, total_iters, loss, best_loss, streams, device)
        self.invoke("signsgd_step", ctypes.byref(args))

    def signsgd_experts_step(self, params, num_experts, lrs, tokens=None, epoch=None, total_iters=0, loss=None,
                             best_loss=None, streams=None, device=None):
        """signsgd_step of a block's experts (ABI 1.10): params as signsgd_step takes them,
        expert-major (num_experts of len(params) / num_experts each, the k-th of one size
        for every expert); tokens as for signround_experts_qdq: an expert with 0 is not
        updated, but kept as best with the rest."""
        keep, args = self._signsgd_args(params, lrs, epoch, total_iters, loss, best_loss, streams, device)
        tokens_array, (tokens_at,) = _described([{"tokens": tokens, "device": device}], ("tokens",))
        experts = _abi.SignSgdExpertsArgs(ctypes.sizeof(_abi.SignSgdExpertsArgs), ctypes.pointer(args),
                                          int(num_experts), *tokens_at)
        self.invoke("signsgd_experts_step", ctypes.byref(experts))

    def _signsgd_args(self, params, lrs, epoch, total_iters, loss, best_loss, streams, device):
        """The qlink_signsgd_args of signsgd_step's arguments, and what must outlive it."""
        records = [dict(p, device=device) if device is not None else p for p in params]
        singles = {"lrs": lrs, "epoch": epoch, "loss": loss, "best_loss": best_loss}
        present = {k: t for k, t in singles.items() if t is not None}
        array, addresses = _described(records + [{**present, **({} if device is None else {"device": device})}],
                                      _SIGNSGD_TENSORS + tuple(singles))
        k = len(_SIGNSGD_TENSORS)
        specs = (_abi.SignSgdParam * max(len(params), 1))()
        for i, spec in enumerate(specs[:len(params)]):
            spec.struct_size = ctypes.sizeof(_abi.SignSgdParam)
            spec.param, spec.grad, spec.best = addresses[i][:k]
            spec.lr_group = int(params[i].get("lr_group", 0))
        lrs_at, epoch_at, loss_at, best_loss_at = addresses[-1][k:]
        args = _abi.SignSgdArgs(ctypes.sizeof(_abi.SignSgdArgs), specs, len(params), lrs_at, epoch_at,
                                int(total_iters), loss_at, best_loss_at, *self.stream_list(streams))
        return (array, specs), args
