"""qlink: the multi-GPU runtime for LLM quantization, from Python.

    import qlink
    ctx = qlink.load({"backend": "auto", "p2p": {"mode": "auto"}})
    ctx.enable_peer_access()
    ctx.peer_copy_batch(sources, targets)

Every call is a method of a Context; the module-level functions below are the same calls
on the process default context (qlink.configure installs it), or on ctx= where given.
Hosts: qlink.integrations.gptqmodel and qlink.integrations.autoround."""
from ._version import __version__
from .collectives import PreparedAllReduce, all_reduce, broadcast, mirror_module, reduce
from .comm import Communicator, torch_nccl_library, unique_id
from .config import P2PConfig
from .context import Context
from .copies import PreparedCopy
from .copy_calls import CopyPlan
from .errors import InvalidArgumentError, QlinkError, UnavailableError, VersionMismatchError
from .p2p import (can_copy, clone_module_for_devices, configure, default_context, enable_for_devices,
                  enable_peer_access, move_module_to_device, move_nested_to_device, peer_copy_batch, peer_matrix)
from .peers import DeviceInfo, PeerStatus


def load(config=None, library=None):
    """A new qlink context.

    config: None (defaults), a P2PConfig, a dict of P2PConfig's fields, or a dict of the
    whole JSON config. library: path of libqlink.so; by default the one in qlink/lib/."""
    return Context(config, library)


__all__ = ["__version__", "load", "configure", "default_context", "Context", "P2PConfig", "PeerStatus", "DeviceInfo",
           "enable_peer_access", "enable_for_devices", "peer_matrix", "can_copy", "peer_copy_batch",
           "move_module_to_device", "move_nested_to_device", "clone_module_for_devices", "mirror_module",
           "PreparedCopy", "CopyPlan", "broadcast", "reduce", "all_reduce", "PreparedAllReduce", "Communicator",
           "unique_id", "torch_nccl_library", "QlinkError", "InvalidArgumentError", "UnavailableError",
           "VersionMismatchError"]
