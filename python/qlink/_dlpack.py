"""torch tensors as DLPack DLTensors (the C struct), without a capsule per leaf."""
import ctypes

import torch

from . import _abi

_DTYPES = {
    torch.float32: (2, 32), torch.float64: (2, 64), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.int8: (0, 8), torch.int16: (0, 16), torch.int32: (0, 32), torch.int64: (0, 64),
    torch.uint8: (1, 8), torch.bool: (1, 8), torch.complex64: (5, 64), torch.complex128: (5, 128),
}


def dl_device(device):
    """(DLDeviceType, id) of a torch.device; ROCm builds of PyTorch call their GPUs "cuda"."""
    if device.type == "cuda":
        return (_abi.KDL_ROCM if torch.version.hip else _abi.KDL_CUDA), device.index
    if device.type == "cpu":
        return _abi.KDL_CPU, 0
    raise ValueError("qlink does not handle %s tensors" % device.type)


def dl_dtype(dtype):
    # Bytes are copied, not converted: a dtype DLPack 0.6 cannot name travels as unsigned bytes.
    return _DTYPES.get(dtype, (1, torch.empty((), dtype=dtype).element_size() * 8))


class TensorArray:
    """A C array of DLTensor describing `tensors`; keeps shapes and strides alive with it.

    device_ids, when given, overrides each tensor's device index (the CPU backend's
    virtual devices all live in host memory)."""

    def __init__(self, tensors, device_ids=None):
        n = len(tensors)
        self.array = (_abi.DLTensor * n)()
        self._dims = []
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError("leaf %d is a %s, not a torch.Tensor" % (i, type(t).__name__))
            dev_type, dev_id = dl_device(t.device)
            if device_ids is not None:
                dev_id = device_ids[i]
            code, bits = dl_dtype(t.dtype)
            ndim = t.dim()
            shape = (ctypes.c_int64 * max(ndim, 1))(*t.shape)
            strides = (ctypes.c_int64 * max(ndim, 1))(*t.stride())
            self._dims.append((shape, strides))
            d = self.array[i]
            d.data = t.data_ptr()
            d.device.device_type = dev_type
            d.device.device_id = dev_id
            d.ndim = ndim
            d.dtype.code, d.dtype.bits, d.dtype.lanes = code, bits, 1
            d.shape = shape
            d.strides = strides
            d.byte_offset = 0
        self.count = n
