"""One scenario of the torch bridge (libqlink_torch.so) over the fake shim
(fake_torch_shim.cc), run by test_bridge_fake.py in a process of its own: the bridge binds
once per process, and a process bound to the fake must never hand it real tensors (so
this one keeps the package from binding the real shim, and builds its DLTensors itself).

Fake tensors live in CPU memory and claim GPU indices; the copies run on the CPU
backend's virtual devices. Usage: fake_bridge_scenarios.py LIBQLINK FAKE_SHIM SCENARIO"""
import ctypes
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import qlink  # noqa: E402
from qlink import _abi, _bridge, _dlpack  # noqa: E402

library, shim_path, scenario = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
_bridge._tried.add(os.path.dirname(library))  # the package leaves this process's bridge alone

shim = ctypes.CDLL(shim_path)
I64P = ctypes.POINTER(ctypes.c_int64)
shim.fake_tensor.restype = ctypes.c_void_p
shim.fake_tensor.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64, I64P, I64P]
shim.fake_view.restype = ctypes.c_void_p
shim.fake_view.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, I64P, I64P]
shim.fake_storage.restype = ctypes.c_void_p
shim.fake_storage.argtypes = [ctypes.c_void_p]
shim.aoti_torch_delete_tensor_object.argtypes = [ctypes.c_void_p]
shim.aoti_torch_new_tensor_handle.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
shim.aoti_torch_get_data_ptr.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
shim.aoti_torch_get_device_index.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
shim.aoti_torch_get_dtype.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype, capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
capsule_pointer.restype, capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]

CPU, CUDA, OTHER = 0, 1, 5  # device types as the fake numbers them
UINT8, INT64, FLOAT32, BFLOAT16 = 0, 4, 6, 15
SIZES = {UINT8: 1, INT64: 8, FLOAT32: 4, BFLOAT16: 2}


class Fake:
    """A fake tensor: one handle, released with the object."""

    def __init__(self, handle):
        self.handle = handle

    def __del__(self):
        shim.aoti_torch_delete_tensor_object(self.handle)

    def _get(self, fn, kind):
        out = kind()
        fn(self.handle, ctypes.byref(out))
        return out.value

    @property
    def data_ptr(self):
        return self._get(shim.aoti_torch_get_data_ptr, ctypes.c_void_p) or 0

    @property
    def device(self):
        return self._get(shim.aoti_torch_get_device_index, ctypes.c_int32)

    @property
    def dtype(self):
        return self._get(shim.aoti_torch_get_dtype, ctypes.c_int32)

    @property
    def storage(self):
        return shim.fake_storage(self.handle)


def to_handles(tensors):
    for t in tensors:  # all checked before any handle is made, as PyTorch's conversion does
        if not isinstance(t, Fake):
            raise TypeError("%s is not a tensor" % type(t).__name__)
    out = []
    for t in tensors:
        h = ctypes.c_void_p()
        shim.aoti_torch_new_tensor_handle(t.handle, ctypes.byref(h))
        out.append(capsule_new(h.value, None, None))
    return out


def from_handles(capsules):
    return [Fake(capsule_pointer(c, None)) for c in capsules]


def tensor(device, dtype, sizes, strides=None, device_type=CUDA, seed=None):
    if strides is None:
        strides, step = [], 1
        for s in reversed(sizes):
            strides.insert(0, step)
            step *= s
    arr = lambda v: (ctypes.c_int64 * max(len(v), 1))(*v)  # noqa: E731
    t = Fake(shim.fake_tensor(device_type, device, dtype, len(sizes), arr(sizes), arr(strides)))
    if seed is not None:
        n = nbytes(t)
        ctypes.memmove(t.data_ptr, bytes((seed * 31 + 7 * k) % 251 for k in range(n)), n)
    return t


def view(base, offset, sizes, strides):
    arr = lambda v: (ctypes.c_int64 * max(len(v), 1))(*v)  # noqa: E731
    return Fake(shim.fake_view(base.handle, offset, len(sizes), arr(sizes), arr(strides)))


def nbytes(t):
    return int(records([t])[0]["nbytes"])


def content(t):
    return ctypes.string_at(t.data_ptr, nbytes(t))


def records(tensors):
    import numpy as np
    return np.frombuffer(bridge.describe(tensors), _bridge.LEAF)


bridge = _bridge.import_module(os.path.join(os.path.dirname(library), "libqlink_torch.so"))
bridge.bind(shim_path, shim_path, to_handles, from_handles)
assert bridge.has_streams()
ctx = qlink.load({"backend": "cpu", "cpu_devices": 4, "log_level": "off"}, library=library)
plugin = ctx.bridge_plugin()


def scenario_describe():
    leaves = [tensor(0, FLOAT32, [3, 5]), tensor(2, BFLOAT16, [7]), tensor(0, INT64, [4], device_type=CPU),
              tensor(1, FLOAT32, [4, 2], strides=[1, 4]), tensor(3, UINT8, [0]),
              tensor(0, FLOAT32, [2], device_type=OTHER)]
    r = records(leaves)
    assert list(r["device"]) == [0, 2, -1, 1, 3, -2], r
    assert list(r["nbytes"]) == [60, 14, 32, 32, 0, 8], r
    assert list(r["flags"] & _bridge.CONTIGUOUS) == [1, 1, 1, 0, 1, 1], r
    assert [int(d) for d in r["data"][:4]] == [t.data_ptr for t in leaves[:4]]
    try:
        bridge.describe([leaves[0], "weights"])
        raise AssertionError("a string was described")
    except TypeError:
        pass


def scenario_move():
    base = tensor(0, UINT8, [4096], seed=9)
    leaves = [tensor(0, FLOAT32, [3, 5], seed=1), tensor(2, BFLOAT16, [1000], seed=2),
              tensor(0, UINT8, [9 << 20], seed=3),           # own allocation (>= 8 MiB)
              tensor(1, FLOAT32, [8], seed=4),               # already on the target
              tensor(0, INT64, [4], device_type=CPU, seed=5),  # host
              view(base, 0, [3000], [1]), view(base, 2048, [2048], [1]),  # overlap: a tie
              tensor(0, FLOAT32, [4, 2], strides=[1, 4], seed=6),  # not contiguous
              tensor(0, FLOAT32, [0]),                      # empty
              tensor(3, INT64, [33], seed=7)]
    status, moved = bridge.move(*plugin, leaves, 1)
    assert status == 0
    assert moved[3] is leaves[3]
    assert moved[4:9] == [None] * 5, moved
    small = [moved[i] for i in (0, 1, 9)]
    for i in (0, 1, 2, 9):
        assert moved[i].device == 1 and moved[i].dtype == leaves[i].dtype
        assert content(moved[i]) == content(leaves[i]), i
    assert len({t.storage for t in small}) == 1 and moved[2].storage != small[0].storage
    offsets = [t.data_ptr - small[0].data_ptr for t in small]
    assert offsets == [0, 256, 2304], offsets  # 60 -> 256, 2000 -> 2048: each leaf on a 256-byte boundary
    assert records(small)[0]["flags"] & _bridge.CONTIGUOUS
    status, moved_again = bridge.move(*plugin, [leaves[3]], 1)
    assert (status, moved_again) == (0, [leaves[3]])


def scenario_copy():
    sources = [tensor(0, FLOAT32, [64], seed=1), tensor(2, UINT8, [100], seed=2)]
    targets = [tensor(1, INT64, [32]), tensor(3, UINT8, [100])]
    assert bridge.copy(*plugin, sources, targets) == 0
    assert [content(t) for t in targets] == [content(s) for s in sources]
    host = tensor(0, UINT8, [100], device_type=CPU)
    assert bridge.copy(*plugin, sources, [targets[0], host]) is None  # the general path's case
    odd = tensor(1, FLOAT32, [8, 8], strides=[1, 8])
    assert bridge.copy(*plugin, [sources[0]], [odd]) is None
    fresh = tensor(1, UINT8, [200])
    status = bridge.copy(*plugin, [sources[1], sources[1]], [view(fresh, 0, [100], [1]), view(fresh, 50, [100], [1])])
    assert status == _abi.INVALID_ARGUMENT, status  # overlapping destinations: refused whole
    assert content(fresh) == bytes(200)
    try:
        bridge.copy(*plugin, sources, targets[:1])
        raise AssertionError("uneven lists were copied")
    except ValueError:
        pass


def scenario_run():
    sources = [tensor(0, UINT8, [300], seed=s) for s in range(3)]
    targets = [tensor(2, UINT8, [300]) for _ in range(3)]
    src = _dlpack.byte_runs([t.data_ptr for t in sources], [300] * 3, _abi.KDL_CPU, [0] * 3)
    dst = _dlpack.byte_runs([t.data_ptr for t in targets], [300] * 3, _abi.KDL_CPU, [2] * 3)
    args = _abi.CopyArgs(ctypes.sizeof(_abi.CopyArgs), src.pointer, dst.pointer, src.count, None, 0, 0)
    plan = ctypes.c_void_p()
    ctx.invoke("copy_plan_create", ctypes.byref(args), ctypes.byref(plan))
    execute = ctx.function_address("copy_plan_execute")
    try:
        assert bridge.run(execute, plan.value, _abi.KDL_CPU, (0, 2)) == 0
        ctx.synchronize(2)
        assert [content(t) for t in targets] == [content(s) for s in sources]
        assert bridge.run(execute, plan.value, _abi.KDL_CPU, (0, 9)) == _abi.INVALID_ARGUMENT
    finally:
        ctx.function("copy_plan_destroy")(plan)
    # An all-reduce plan through the same call, replayed twice: every buffer ends 2 x the sum.
    buffers = [tensor(d, FLOAT32, [3]) for d in (0, 1)]
    for t, values in zip(buffers, ([1.0, 2.0, 3.0], [10.0, 20.0, 30.0])):
        ctypes.memmove(t.data_ptr, struct.pack("3f", *values), 12)
    packed = _dlpack.byte_runs([t.data_ptr for t in buffers], [3, 3], _abi.KDL_CPU, [0, 1], dtypes=[(2, 32)] * 2)
    args = _abi.AllReduceArgs(ctypes.sizeof(_abi.AllReduceArgs), packed.pointer, 2, _abi.REDUCE_OPS["sum"],
                              _abi.TRANSPORTS["fp32"], None, 0, _abi.ALL_REDUCE_ALGORITHMS["auto"])
    plan = ctypes.c_void_p()
    ctx.invoke("all_reduce_plan_create", ctypes.byref(args), ctypes.byref(plan))
    execute = ctx.function_address("all_reduce_plan_execute")
    try:
        for _ in range(2):
            assert bridge.run(execute, plan.value, _abi.KDL_CPU, (0, 1)) == 0
        ctx.synchronize(0)
        ctx.synchronize(1)
        assert [content(t) for t in buffers] == [struct.pack("3f", 22.0, 44.0, 66.0)] * 2
        assert bridge.run(execute, plan.value, _abi.KDL_CPU, (1, 9)) == _abi.INVALID_ARGUMENT
    finally:
        ctx.function("all_reduce_plan_destroy")(plan)


def scenario_arguments():
    for call, args in [(bridge.move, plugin), (bridge.copy, plugin), (bridge.run, plugin[:2])]:
        try:
            call(*args)
            raise AssertionError("%s took too few arguments" % call.__name__)
        except TypeError:
            pass
    try:
        bridge.move(*plugin, [tensor(0, UINT8, [8]), 3.5], 1)
        raise AssertionError("a float was moved")
    except TypeError:
        pass


globals()["scenario_" + scenario]()
ctx.close()
import gc  # noqa: E402
gc.collect()
assert (shim.fake_live_handles(), shim.fake_live_storages()) == (0, 0), (
    "left alive: %d handles, %d storages" % (shim.fake_live_handles(), shim.fake_live_storages()))
print("ok")
