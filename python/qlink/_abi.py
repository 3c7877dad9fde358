"""ctypes mirror of plugin_api/qlink.h (ABI 1.9). Keep in step with the header."""
import ctypes
from ctypes import (POINTER, c_char, c_char_p, c_double, c_int32, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64,
                    c_void_p)

ABI_MAJOR = 1
ABI_MINOR = 11

OK, INVALID_ARGUMENT, UNAVAILABLE, VERSION_MISMATCH, OUT_OF_MEMORY, RUNTIME_ERROR, INTERNAL = range(7)

KDL_CPU, KDL_CUDA, KDL_ROCM = 1, 2, 10

PEER_STATES = ("not_applicable", "not_requested", "disabled", "unsupported", "enable_failed", "probe_rejected",
               "enabled")


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(ctypes.c_int64)), ("strides", POINTER(ctypes.c_int64)), ("byte_offset", c_uint64)]


class DeviceInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("device", DLDevice), ("name", c_char * 128), ("total_bytes", c_uint64),
                ("free_bytes", c_uint64)]


class PeerInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("src_device", c_int32), ("dst_device", c_int32), ("state", c_int32),
                ("probed", c_int32), ("peer_gbps", c_double), ("regular_gbps", c_double), ("reason", c_char * 256)]


class LinkMeasurement(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("bytes", c_uint64), ("gbps", c_double), ("latency_us", c_double),
                ("used_peer", c_int32)]


class Stream(ctypes.Structure):
    _fields_ = [("device", DLDevice), ("stream", c_void_p)]


# The argument structs hold their DLTensor arrays as plain addresses (ints), which ctypes
# takes without building a pointer object per call.
class CopyArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("sources", c_void_p), ("destinations", c_void_p),
                ("num_leaves", c_size_t), ("streams", POINTER(Stream)), ("num_streams", c_size_t),
                ("flags", c_uint32)]


COPY_SOURCES_READY, COPY_SOURCES_HELD, COPY_WAIT = 1, 2, 4  # qlink_copy_flags


def copy_flags(sources_ready, sources_held, wait):
    """The qlink_copy_flags for the host's two promises and whether the call blocks."""
    return ((COPY_SOURCES_READY if sources_ready else 0) | (COPY_SOURCES_HELD if sources_held else 0) |
            (COPY_WAIT if wait else 0))


class BroadcastArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("sources", c_void_p), ("num_leaves", c_size_t),
                ("destinations", c_void_p), ("num_replicas", c_size_t), ("streams", POINTER(Stream)),
                ("num_streams", c_size_t), ("flags", c_uint32)]


class ReduceArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("inputs", c_void_p), ("num_inputs", c_size_t),
                ("output", c_void_p), ("scale", c_double), ("streams", POINTER(Stream)),
                ("num_streams", c_size_t)]


class AllReduceArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("buffers", c_void_p), ("num_buffers", c_size_t), ("op", c_int32),
                ("transport", c_int32), ("streams", POINTER(Stream)), ("num_streams", c_size_t),
                ("algorithm", c_int32)]


class HessianArgs(ctypes.Structure):  # 1.4; precision 1.6; input_partials 1.8
    _fields_ = [("struct_size", c_size_t), ("inputs", c_void_p), ("num_inputs", c_size_t), ("partials", c_void_p),
                ("num_partials", c_size_t), ("streams", POINTER(Stream)), ("num_streams", c_size_t),
                ("precision", c_int32), ("input_partials", POINTER(c_int32))]


HESSIAN_PRECISIONS = {"default": 0, "ieee_fp32": 1, "tensor": 2, "tensor_gemm": 3}  # qlink_hessian_precision


GPTQ_INVERSES = {"cholesky_inverse": 0, "triangular": 1}  # qlink_gptq_inverse


class GptqOptions(ctypes.Structure):  # 1.4; act_group_aware 1.5; inverse 1.11
    _fields_ = [("struct_size", c_size_t), ("bits", c_int32), ("group_size", c_int32), ("sym", c_int32),
                ("desc_act", c_int32), ("static_groups", c_int32), ("tf32", c_int32), ("damp", c_double),
                ("damp_auto_increment", c_double), ("nsamples", c_double), ("act_group_aware", c_int32),
                ("inverse", c_int32)]


class GptqLayer(ctypes.Structure):  # 1.4; the tensors as addresses of DLTensors
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("weight", c_void_p), ("hessian", c_void_p),
                ("codes", c_void_p), ("scales", c_void_p), ("zeros", c_void_p), ("g_idx", c_void_p),
                ("dequantized", c_void_p), ("loss", c_double), ("damp", c_double)]


class GptqArgs(ctypes.Structure):  # 1.4
    _fields_ = [("struct_size", c_size_t), ("options", POINTER(GptqOptions)), ("layers", POINTER(GptqLayer)),
                ("num_layers", c_size_t), ("devices", POINTER(c_int32)), ("num_devices", c_size_t),
                ("streams", POINTER(Stream)), ("num_streams", c_size_t)]


class SignRoundOptions(ctypes.Structure):  # 1.7
    _fields_ = [("struct_size", c_size_t), ("bits", c_int32), ("group_size", c_int32), ("sym", c_int32),
                ("scale_dtype", DLDataType), ("q_scale_thresh", c_double)]


class SignRoundLayer(ctypes.Structure):  # 1.7, 1.9 (best_v, lr_group)
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p)] + [
        (field, c_void_p) for field in ("weight", "v", "min_scale", "max_scale", "qdq", "grad_qdq", "grad_v",
                                        "grad_min_scale", "grad_max_scale", "best_v")] + [("lr_group", c_int32)]


class SignRoundArgs(ctypes.Structure):  # 1.7, 1.9 (step_lrs, loss, best_loss)
    _fields_ = [("struct_size", c_size_t), ("options", POINTER(SignRoundOptions)),
                ("layers", POINTER(SignRoundLayer)), ("num_layers", c_size_t), ("streams", POINTER(Stream)),
                ("num_streams", c_size_t), ("step_lrs", c_void_p), ("loss", c_void_p), ("best_loss", c_void_p)]


class SignSgdParam(ctypes.Structure):  # 1.7
    _fields_ = [("struct_size", c_size_t), ("param", c_void_p), ("grad", c_void_p), ("best", c_void_p),
                ("lr_group", c_int32)]


class SignSgdArgs(ctypes.Structure):  # 1.7
    _fields_ = [("struct_size", c_size_t), ("params", POINTER(SignSgdParam)), ("num_params", c_size_t),
                ("lrs", c_void_p), ("epoch", c_void_p), ("total_iters", ctypes.c_int64), ("loss", c_void_p),
                ("best_loss", c_void_p), ("streams", POINTER(Stream)), ("num_streams", c_size_t)]


class SignRoundExpertsArgs(ctypes.Structure):  # 1.10
    _fields_ = [("struct_size", c_size_t), ("layers", POINTER(SignRoundArgs)), ("tokens", c_void_p)]


class SignSgdExpertsArgs(ctypes.Structure):  # 1.10
    _fields_ = [("struct_size", c_size_t), ("step", POINTER(SignSgdArgs)), ("num_experts", c_size_t),
                ("tokens", c_void_p)]


class UniqueId(ctypes.Structure):
    _fields_ = [("bytes", c_char * 128)]


REDUCE_OPS = {"sum": 0, "avg": 1, "sign": 2}
TRANSPORTS = {"fp32": 0, "bf16": 1}
ALL_REDUCE_ALGORITHMS = {"auto": 0, "two_shot": 1, "halving_doubling": 2}

_S = c_int32  # qlink_status
_F = ctypes.CFUNCTYPE

# (name, restype, argtypes) in table order: append-only, like the header.
_TABLE = [
    ("last_error", c_char_p, []),
    ("context_create", _S, [c_char_p, POINTER(c_void_p)]),
    ("context_destroy", _S, [c_void_p]),
    ("backend_name", _S, [c_void_p, POINTER(c_char_p)]),
    ("device_count", _S, [c_void_p, POINTER(c_int32)]),
    ("device_info", _S, [c_void_p, c_int32, POINTER(DeviceInfo)]),
    ("enable_peer_access", _S, [c_void_p, POINTER(c_int32), c_size_t]),
    ("peer_info", _S, [c_void_p, c_int32, c_int32, POINTER(PeerInfo)]),
    ("measure_link", _S, [c_void_p, c_int32, c_int32, c_uint64, POINTER(LinkMeasurement)]),
    ("copy_batch", _S, [c_void_p, POINTER(CopyArgs)]),
    ("copy_plan_create", _S, [c_void_p, POINTER(CopyArgs), POINTER(c_void_p)]),
    ("copy_plan_execute", _S, [c_void_p, POINTER(Stream), c_size_t]),
    ("copy_plan_destroy", _S, [c_void_p]),
    ("memory_allocate", _S, [c_void_p, c_int32, c_uint64, POINTER(c_void_p)]),
    ("memory_free", _S, [c_void_p, c_int32, c_void_p]),
    ("memory_to_host", _S, [c_void_p, c_int32, c_void_p, c_void_p, c_uint64]),
    ("memory_from_host", _S, [c_void_p, c_int32, c_void_p, c_void_p, c_uint64]),
    ("stream_synchronize", _S, [c_void_p, c_int32, c_void_p]),
    # 1.1
    ("broadcast", _S, [c_void_p, POINTER(BroadcastArgs)]),
    ("reduce", _S, [c_void_p, POINTER(ReduceArgs)]),
    ("all_reduce", _S, [c_void_p, POINTER(AllReduceArgs)]),
    ("comm_unique_id", _S, [c_void_p, POINTER(UniqueId)]),
    ("comm_create", _S, [c_void_p, POINTER(UniqueId), c_int32, c_int32, c_int32, POINTER(c_void_p)]),
    ("comm_destroy", _S, [c_void_p]),
    ("comm_all_reduce", _S, [c_void_p, c_void_p, c_int32, c_void_p]),
    ("comm_broadcast", _S, [c_void_p, c_void_p, c_int32, c_void_p]),
    ("comm_reduce", _S, [c_void_p, c_void_p, c_int32, c_double, c_void_p]),
    # 1.2
    ("all_reduce_plan_create", _S, [c_void_p, POINTER(AllReduceArgs), POINTER(c_void_p)]),
    ("all_reduce_plan_execute", _S, [c_void_p, POINTER(Stream), c_size_t]),
    ("all_reduce_plan_destroy", _S, [c_void_p]),
    # 1.4
    ("hessian_accumulate", _S, [c_void_p, POINTER(HessianArgs)]),
    ("gptq_quantize", _S, [c_void_p, POINTER(GptqArgs)]),
    # 1.7
    ("signround_qdq", _S, [c_void_p, POINTER(SignRoundArgs)]),
    ("signround_qdq_backward", _S, [c_void_p, POINTER(SignRoundArgs)]),
    ("signsgd_step", _S, [c_void_p, POINTER(SignSgdArgs)]),
    # 1.10
    ("signround_experts_qdq", _S, [c_void_p, POINTER(SignRoundExpertsArgs)]),
    ("signround_experts_qdq_backward", _S, [c_void_p, POINTER(SignRoundExpertsArgs)]),
    ("signsgd_experts_step", _S, [c_void_p, POINTER(SignSgdExpertsArgs)]),
]


class Api(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("abi_major", c_uint32), ("abi_minor", c_uint32)] + [
        (name, _F(restype, *argtypes)) for name, restype, argtypes in _TABLE]
