"""torch tensors as DLPack DLTensors (the C struct), without a capsule per leaf.

Two packers: `pack` describes a list of contiguous tensors as byte vectors in one numpy
array (one call into the torch bridge where it is bound, else a few C-level calls per
leaf; no Python loop body either way), and `TensorArray` describes
each tensor exactly (dtype, shape, strides) when some leaf is not contiguous, so the
plugin can name it in its refusal."""
import ctypes
import operator
import struct

import numpy as np
import torch

from . import _abi, _bridge

_DTYPES = {
    torch.float32: (2, 32), torch.float64: (2, 64), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.int8: (0, 8), torch.int16: (0, 16), torch.int32: (0, 32), torch.int64: (0, 64),
    torch.uint8: (1, 8), torch.bool: (1, 8), torch.complex64: (5, 64), torch.complex128: (5, 128),
}

assert ctypes.sizeof(_abi.DLTensor) == 48  # dlpack.h on 64-bit hosts: the six words byte_vectors writes

_DATA_PTR = torch.Tensor.data_ptr
_GET_DEVICE = torch.Tensor.get_device
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_DTYPE = operator.attrgetter("dtype")
if hasattr(torch.Tensor, "nbytes"):
    _NBYTES = operator.attrgetter("nbytes")
else:  # PyTorch < 2.1
    def _NBYTES(t):
        return t.numel() * t.element_size()


_GPU_TYPE = _abi.KDL_ROCM if torch.version.hip else _abi.KDL_CUDA  # ROCm builds of PyTorch call their GPUs "cuda"


def device_type_of(device):
    """DLDeviceType of a torch.device; ROCm builds of PyTorch call their GPUs "cuda"."""
    if device.type == "cuda":
        return _GPU_TYPE
    if device.type == "cpu":
        return _abi.KDL_CPU
    raise ValueError("qlink does not handle %s tensors" % device.type)


def _dtype_of(dtype):
    # Bytes are copied, not converted: a dtype DLPack 0.6 cannot name travels as unsigned bytes.
    code_bits = _DTYPES.get(dtype)
    return code_bits if code_bits is not None else (1, torch.empty((), dtype=dtype).element_size() * 8)


class Packed:
    """A C array of `count` DLTensors at address `pointer` (an int, as the ABI structs take
    it), kept alive with everything it points into by `keep`; the device indices it names,
    and whether any leaf is a host tensor."""

    def __init__(self, pointer, count, keep, devices, host):
        self.pointer = pointer
        self.count = count
        self._keep = keep
        self.devices = devices
        self.host = host


def pack(tensors, device_ids=None, exact=False):
    """tensors as DLTensors; device_ids overrides each tensor's device index (the CPU
    backend's virtual devices all live in CPU memory). exact keeps dtypes and shapes
    (for calls that compute, not copy)."""
    n = len(tensors)
    if n == 0:
        return Packed(None, 0, None, set(), False)
    if n <= _SMALL:
        return _small(tensors, device_ids, exact)
    try:
        ids, data, nbytes, contiguous = describe(tensors)
        dtypes = [_dtype_of(d) for d in map(_DTYPE, tensors)] if exact else None
    except (TypeError, AttributeError):
        return _exact(tensors, device_ids)  # not all tensors: TensorArray names the culprit
    if not contiguous.all():
        return _exact(tensors, device_ids)
    dev_type = device_type_of(tensors[0].device)
    if device_ids is None:
        if (ids < 0).any() if dev_type != _abi.KDL_CPU else (ids != -1).any():
            return _exact(tensors)  # mixed host and device leaves: the plugin names the culprit
        device_ids = ids if dev_type != _abi.KDL_CPU else 0
    elif not isinstance(device_ids, int):
        device_ids = np.asarray(device_ids, dtype=np.int64)
    if not exact:
        return byte_vectors(data, nbytes, dev_type, device_ids)
    return byte_vectors(data, nbytes // np.array([bits // 8 for _, bits in dtypes], np.int64), dev_type, device_ids,
                        [_dtype_word(code, bits) for code, bits in dtypes])


def describe(tensors):
    """Device index (-1: host), data pointer, byte size and contiguity of each tensor, as
    numpy arrays; one C call through the bridge where it is bound."""
    bridge = _bridge.get()
    if bridge is not None:
        leaves = np.frombuffer(bridge.describe(tensors), _bridge.LEAF)
        return leaves["device"], leaves["data"], leaves["nbytes"], (leaves["flags"] & _bridge.CONTIGUOUS) != 0
    n = len(tensors)
    return (np.fromiter(map(_GET_DEVICE, tensors), np.int32, n), np.fromiter(map(_DATA_PTR, tensors), np.uint64, n),
            np.fromiter(map(_NBYTES, tensors), np.int64, n), np.fromiter(map(_IS_CONTIGUOUS, tensors), bool, n))


# A DLTensor as six little-endian 64-bit words: data | device_type, device_id |
# ndim, dtype | shape | strides | byte_offset. Filling whole columns of a (n, 6) array is
# several times cheaper than assigning the fields of a structured array.
def _dtype_word(code, bits):
    """Word 2 of a 1-D DLTensor: ndim 1, dtype code x bits x 1 lane."""
    return 1 | (code << 32) | (bits << 40) | (1 << 48)


_BYTE_VECTOR_WORD2 = _dtype_word(1, 8)  # kDLUInt x 8 bits


def byte_vectors(data, nbytes, device_type, device_ids, dtype_words=_BYTE_VECTOR_WORD2):
    """DLTensors of contiguous byte runs: data pointers and byte sizes as arrays, device
    ids as an array or one int for all. dtype_words (ndim, dtype) makes them vectors of
    another element type, nbytes then counting elements."""
    n = len(data)
    nbytes = np.ascontiguousarray(nbytes, dtype=np.int64)
    words = np.zeros((n, 6), np.uint64)  # strides NULL (compact), byte_offset 0
    words[:, 0] = data
    if isinstance(device_ids, (int, np.integer)):
        words[:, 1] = (int(device_ids) << 32) | device_type
        devices = {int(device_ids)}
    else:
        first = int(device_ids[0])
        if (device_ids == first).all():
            words[:, 1] = (first << 32) | device_type
            devices = {first}
        else:
            words[:, 1] = (device_ids.astype(np.uint64) << np.uint64(32)) | np.uint64(device_type)
            devices = set(np.unique(device_ids).tolist())
    words[:, 2] = dtype_words
    shapes = nbytes.ctypes.data
    words[:, 3] = np.arange(shapes, shapes + 8 * n, 8, dtype=np.uint64)
    return Packed(words.ctypes.data, n, (words, nbytes), devices, device_type == _abi.KDL_CPU)


# Up to this many leaves, one struct.pack_into per leaf beats numpy's fixed costs (which
# dominate a 2-buffer all-reduce).
_SMALL = 8
_DL_STRUCT = struct.Struct("<QiiiBBHQQQ")  # one DLTensor as dlpack.h lays it out
_SHAPE_STRUCT = struct.Struct("<q")
assert _DL_STRUCT.size == ctypes.sizeof(_abi.DLTensor)


def _small(tensors, device_ids, exact):
    """A few contiguous tensors as 1-D DLTensors: bytes, or their own dtype when exact."""
    try:
        host = not tensors[0].is_cuda
        dev_type = _abi.KDL_CPU if host else _GPU_TYPE
    except AttributeError:
        return _exact(tensors, device_ids)  # not a tensor: TensorArray names the leaf
    if host and tensors[0].device.type != "cpu":
        device_type_of(tensors[0].device)  # raises: neither a CPU nor a GPU tensor
    data, sizes, devices, dtypes = [], [], [], []
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or not t.is_contiguous():
            return _exact(tensors, device_ids)  # the plugin or TensorArray names the culprit
        own = t.get_device()
        if (own < 0) != host:
            return _exact(tensors, device_ids)
        data.append(t.data_ptr())
        sizes.append(t.numel() if exact else _NBYTES(t))
        devices.append(device_ids[i] if device_ids is not None else 0 if host else own)
        if exact:
            dtypes.append(_dtype_of(t.dtype))
    return byte_runs(data, sizes, dev_type, devices, dtypes if exact else None)


def byte_runs(data, nbytes, device_type, device_ids, dtypes=None):
    """A few contiguous byte runs as DLTensors, one device id each (byte_vectors without
    numpy's fixed costs). dtypes, (code, bits) per run, makes them vectors of those
    element types, nbytes then counting elements."""
    n = len(data)
    buf = (ctypes.c_char * (56 * n))()  # the DLTensors, then one int64 shape each
    shapes = ctypes.addressof(buf) + 48 * n
    for i, (ptr, size, dev) in enumerate(zip(data, nbytes, device_ids)):
        code, bits = dtypes[i] if dtypes is not None else (1, 8)
        _DL_STRUCT.pack_into(buf, 48 * i, ptr, device_type, dev, 1, code, bits, 1, shapes + 8 * i, 0, 0)
        _SHAPE_STRUCT.pack_into(buf, 48 * n + 8 * i, size)
    return Packed(ctypes.addressof(buf), n, buf, set(device_ids), device_type == _abi.KDL_CPU)


def _exact(tensors, device_ids=None):
    exact = TensorArray(tensors, device_ids)
    leaves = [exact.array[i].device for i in range(len(tensors))]
    return Packed(ctypes.addressof(exact.array), len(tensors), exact, {d.device_id for d in leaves},
                  any(d.device_type == _abi.KDL_CPU for d in leaves))


class TensorArray:
    """Each tensor described exactly: dtype, shape and strides."""

    def __init__(self, tensors, device_ids=None):
        n = len(tensors)
        self.array = (_abi.DLTensor * n)()
        self._dims = []
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError("leaf %d is a %s, not a torch.Tensor" % (i, type(t).__name__))
            dev_id = device_ids[i] if device_ids is not None else (t.device.index or 0)
            code, bits = _dtype_of(t.dtype)
            ndim = t.dim()
            shape = (ctypes.c_int64 * max(ndim, 1))(*t.shape)
            strides = (ctypes.c_int64 * max(ndim, 1))(*t.stride())
            self._dims.append((shape, strides))
            d = self.array[i]
            d.data = t.data_ptr()
            d.device.device_type = device_type_of(t.device)
            d.device.device_id = dev_id
            d.ndim = ndim
            d.dtype.code, d.dtype.bits, d.dtype.lanes = code, bits, 1
            d.shape = shape
            d.strides = strides
            d.byte_offset = 0
