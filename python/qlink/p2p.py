"""GPTQModel's P2P names (docs/HOSTS.md, gptqmodel.utils.p2p) on the process default context:
configure, P2PConfig, PeerStatus, enable_peer_access, enable_for_devices, peer_matrix,
can_copy, peer_copy_batch, move_module_to_device, move_nested_to_device,
clone_module_for_devices. Each is the same call on `ctx`, the default context if None."""
from .config import P2PConfig
from .copies import PreparedCopy
from .defaults import configure, default_context
from .peers import PeerStatus
from .streams import current_streams


def _context(ctx):
    return ctx or default_context()


def enable_peer_access(devices=None, ctx=None):
    return _context(ctx).enable_peer_access(devices)


def enable_for_devices(devices, ctx=None):
    return _context(ctx).enable_for_devices(devices)


def peer_matrix(devices=None, ctx=None):
    return _context(ctx).peer_matrix(devices)


def can_copy(src, dst, ctx=None):
    return _context(ctx).can_copy(src, dst)


def peer_copy_batch(sources, targets, ctx=None):
    return _context(ctx).peer_copy_batch(sources, targets)


def move_module_to_device(module, device, ctx=None):
    return _context(ctx).move_module_to_device(module, device)


def move_nested_to_device(value, device, ctx=None):
    return _context(ctx).move_nested_to_device(value, device)


def clone_module_for_devices(module, devices, ctx=None):
    return _context(ctx).clone_module_for_devices(module, devices)


__all__ = ["P2PConfig", "PeerStatus", "PreparedCopy", "configure", "default_context", "current_streams",
           "enable_peer_access", "enable_for_devices", "peer_matrix", "can_copy", "peer_copy_batch",
           "move_module_to_device", "move_nested_to_device", "clone_module_for_devices"]
