"""The Context's calls into qlink's native quantization engine (ABI 1.4): Hessian
accumulation and GPTQ (qlink.quant builds on them)."""
import ctypes

from . import _abi
from ._dlpack import TensorArray
from .errors import InvalidArgumentError

_GPTQ_TENSORS = ("weight", "hessian", "codes", "scales", "zeros", "g_idx", "dequantized")


class EngineCalls:
    """The native engine; part of Context."""

    def hessian_accumulate(self, inputs, partials, input_devices=None, partial_devices=None, streams=None,
                           precision=None):
        """partials[d] += X^T X (fp32, both triangles) for every input X (..., columns) on
        partial d's device (qlink_hessian_args); stream-ordered, like a copy. *_devices:
        qlink device ids where the tensors do not say (the CPU backend's virtual devices).
        precision: "ieee_fp32", "tensor" (bf16/fp16 inputs on tensor cores; fp32 inputs stay
        IEEE) or None, the config's hessian_precision (ABI 1.6)."""
        code = _abi.HESSIAN_PRECISIONS.get("default" if precision is None else precision)
        if code is None or precision == "default":
            raise InvalidArgumentError(_abi.INVALID_ARGUMENT, "precision = %r is not one of None, 'ieee_fp32', "
                                       "'tensor'" % (precision,))
        src, dst = TensorArray(inputs, input_devices), TensorArray(partials, partial_devices)
        args = _abi.HessianArgs(ctypes.sizeof(_abi.HessianArgs), ctypes.addressof(src.array), len(inputs),
                                ctypes.addressof(dst.array), len(partials), *self.stream_list(streams), code)
        self.invoke("hessian_accumulate", ctypes.byref(args))

    def gptq_quantize(self, layers, options, devices=None, streams=None):
        """Quantizes layers (qlink_gptq_args): each a dict of the _GPTQ_TENSORS (outputs may be
        None), an optional "name" and "device" (qlink device id where the tensors do not say);
        options: the qlink_gptq_options fields by name. devices: where the solve may run (None:
        each layer on its own device). Writes the outputs; returns (loss, damp) per layer."""
        tensors, ids, where = [], [], []
        for layer in layers:
            for field in _GPTQ_TENSORS:
                t = layer.get(field)
                where.append(None if t is None else len(tensors))
                if t is not None:
                    tensors.append(t)
                    ids.append(layer.get("device", t.device.index or 0))
        array = TensorArray(tensors, ids)
        base, size = ctypes.addressof(array.array), ctypes.sizeof(_abi.DLTensor)
        specs = (_abi.GptqLayer * max(len(layers), 1))()
        names = [str(layer.get("name") or "").encode() for layer in layers]
        for i, spec in enumerate(specs[:len(layers)]):
            spec.struct_size = ctypes.sizeof(_abi.GptqLayer)
            spec.name = names[i] or None
            for j, field in enumerate(_GPTQ_TENSORS):
                k = where[i * len(_GPTQ_TENSORS) + j]
                setattr(spec, field, None if k is None else base + k * size)
        o = _abi.GptqOptions(ctypes.sizeof(_abi.GptqOptions), **options)
        device_list = [int(d) for d in devices or []]
        device_array = (ctypes.c_int32 * max(len(device_list), 1))(*device_list)
        args = _abi.GptqArgs(ctypes.sizeof(_abi.GptqArgs), ctypes.pointer(o), specs, len(layers),
                             device_array if device_list else None, len(device_list), *self.stream_list(streams))
        self.invoke("gptq_quantize", ctypes.byref(args))
        return [(spec.loss, spec.damp) for spec in specs[:len(layers)]]
