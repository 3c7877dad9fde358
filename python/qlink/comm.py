"""Collectives across processes and nodes through NCCL (RCCL on ROCm), one rank per
Communicator. The host distributes the unique id, e.g. through torch.distributed's store:

    ctx = qlink.load({"backend": "cuda", "nccl_library": qlink.torch_nccl_library()})
    uid = qlink.unique_id(ctx) if rank == 0 else None   # then share its bytes
    comm = qlink.Communicator(ctx, uid, world, rank, device)
    comm.all_reduce(grad, op="sign")
"""
import ctypes
import glob
import os

import torch

from . import _abi
from ._dlpack import pack
from .streams import raw_stream


def torch_nccl_library():
    """Path of the NCCL (or RCCL) library PyTorch's wheel ships, or None."""
    name = "librccl.so*" if torch.version.hip else "libnccl.so*"
    package = os.path.dirname(torch.__file__)
    for root in (os.path.join(os.path.dirname(package), "nvidia"), package):
        found = sorted(glob.glob(os.path.join(root, "**", name), recursive=True))
        if found:
            return found[0]
    return None


def unique_id(ctx):
    """A new communicator id (128 bytes) to hand to every rank."""
    uid = _abi.UniqueId()
    ctx.invoke("comm_unique_id", ctypes.byref(uid))
    return ctypes.string_at(ctypes.addressof(uid), 128)  # .bytes would stop at the first NUL


class Communicator:
    """Rank `rank` of `nranks` on `device`; creating it blocks until every rank joined."""

    def __init__(self, ctx, uid, nranks, rank, device):
        if len(uid) != 128:
            raise ValueError("unique id must be 128 bytes, got %d" % len(uid))
        self._ctx, self.rank, self.nranks, self.device = ctx, rank, nranks, int(device)
        native = _abi.UniqueId()
        ctypes.memmove(ctypes.addressof(native), uid, 128)
        handle = ctypes.c_void_p()
        ctx.invoke("comm_create", ctypes.byref(native), nranks, rank, self.device, ctypes.byref(handle))
        self._handle = handle

    def _call(self, name, tensor, *args):
        packed = pack([tensor], exact=True)
        self._ctx.call(name, self._handle, packed.pointer, *args, raw_stream(self.device))

    def all_reduce(self, tensor, op="sum"):
        if op not in _abi.REDUCE_OPS:
            raise ValueError("op must be one of %s, got %r" % (sorted(_abi.REDUCE_OPS), op))
        self._call("comm_all_reduce", tensor, _abi.REDUCE_OPS[op])

    def broadcast(self, tensor, root=0):
        self._call("comm_broadcast", tensor, root)

    def reduce(self, tensor, root=0, scale=1.0):
        self._call("comm_reduce", tensor, root, float(scale))

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._ctx.function("comm_destroy")(handle)

    __del__ = close
