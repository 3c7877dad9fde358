"""qlink: the multi-GPU runtime for LLM quantization, from Python.

    import qlink
    ctx = qlink.load({"backend": "auto", "p2p": {"mode": "auto"}})
    ctx.enable_peer_access()
    ctx.copy(sources, targets)
"""
from .collectives import PreparedAllReduce, all_reduce, broadcast, mirror_module, reduce
from .comm import Communicator, torch_nccl_library, unique_id
from .config import P2PConfig
from .context import Context, CopyPlan, DeviceInfo, PeerStatus
from .p2p import (PreparedCopy, configure, default_context, move_module_to_device,
                  move_nested_to_device, peer_copy_batch)
from .errors import InvalidArgumentError, QlinkError, UnavailableError, VersionMismatchError


def load(config=None, library=None):
    """A new qlink context.

    config: None (defaults), a dict (the whole JSON config) or a P2PConfig.
    library: path of libqlink.so; by default the one shipped in qlink/lib/."""
    return Context(config, library)


__all__ = ["load", "Communicator", "unique_id", "torch_nccl_library", "broadcast", "reduce", "all_reduce", "PreparedAllReduce", "mirror_module", "configure", "default_context", "peer_copy_batch", "move_module_to_device",
           "move_nested_to_device", "PreparedCopy", "Context", "CopyPlan", "DeviceInfo", "PeerStatus", "P2PConfig", "QlinkError",
           "InvalidArgumentError", "UnavailableError", "VersionMismatchError"]
