"""The Context's module replicas: mirror_module (independent copies of a module on a list
of devices, weights broadcast through qlink) and GPTQModel's clone_module_for_devices."""
import sys
import sysconfig

import torch

from .moves import module_tensors
from .streams import resolved_device


def gil_enabled():
    """Whether this interpreter runs Python one thread at a time (3.13's free-threaded
    builds may not)."""
    probe = getattr(sys, "_is_gil_enabled", None)
    return probe() if probe is not None else not sysconfig.get_config_var("Py_GIL_DISABLED")


def replicate_tree(module, tensors):
    """A copy of `module`'s tree for a replica, as torch.nn.parallel.replicate builds one:
    every submodule a new object whose __dict__ is a copy of the source's (its other
    attributes shared, so nothing that cannot be copied, a lock say, is copied), its
    parameters and buffers those of `tensors` ({id(source tensor): replica tensor}).
    Submodules and tensors that appear twice stay shared within the replica."""
    return _replicate(module, tensors, {})


def _replicate(m, tensors, copies):
    """replicate_tree's walk (module-level: a nested function calling itself is a reference
    cycle, which would keep the replica's tensors until the cyclic collector runs)."""
    if id(m) not in copies:
        r = copies[id(m)] = m.__new__(type(m))
        r.__dict__ = m.__dict__.copy()
        r._parameters = type(m._parameters)((k, None if p is None else tensors[id(p)])
                                            for k, p in m._parameters.items())
        r._buffers = type(m._buffers)((k, None if b is None else tensors[id(b)]) for k, b in m._buffers.items())
        r._modules = type(m._modules)((k, None if c is None else _replicate(c, tensors, copies))
                                      for k, c in m._modules.items())
    return copies[id(m)]


class ReplicaCalls:
    """Module replicas; part of Context."""

    def mirror_module(self, module, devices):
        """Replicas of `module` on `devices`, in order (the source's own device may be among
        them), built as replicate_tree builds them: no parameter or buffer storage shared
        with the source or with each other, other attributes shared. GPU leaves
        that are contiguous are copied by qlink, to the source's device locally and to the
        others along a broadcast tree; the rest (host or non-contiguous leaves) by PyTorch."""
        devices = [resolved_device(d) for d in devices]
        if len(set(devices)) != len(devices):
            raise ValueError("devices %s: each replica needs its own device" % ([str(d) for d in devices],))
        params, buffers = module_tensors(module)
        leaves = params + buffers
        fast = [t for t in leaves if t.is_cuda and t.is_contiguous()]
        fast_ids = {id(t) for t in fast}
        sources = {t.device for t in fast}
        if len(sources) > 1:
            raise ValueError("module %s has GPU tensors on %s: mirror_module needs them on one device" % (
                type(module).__name__, sorted(str(d) for d in sources)))
        replicas, local, remote = [], [], []
        for device in devices:
            tensors, fresh = {}, []
            for t in leaves:
                new = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
                if id(t) in fast_ids:
                    fresh.append(new)
                else:
                    new.copy_(t)  # the regular path: host or non-contiguous leaves
                tensors[id(t)] = torch.nn.Parameter(new, t.requires_grad) if isinstance(t, torch.nn.Parameter) else new
            replicas.append(replicate_tree(module, tensors))
            (local if sources == {device} else remote).append(fresh)
        if fast and local:
            self.peer_copy_batch(fast, local[0])
        if fast and remote:
            self.broadcast(fast, remote)
        return replicas

    def clone_module_for_devices(self, module, devices):
        """GPTQModel's clone_module_for_devices: {device: replica} in the order of `devices`,
        a replica on the source's own device too. With p2p.use_torch_replicate (and the GIL:
        replicate funnels into broadcast_coalesced, which tears copies without it) the
        replicas come from torch.nn.parallel.replicate, otherwise from mirror_module."""
        devices = [resolved_device(d) for d in devices]
        if (self.use_torch_replicate and gil_enabled() and devices and all(d.type == "cuda" for d in devices)):
            replicas = torch.nn.parallel.replicate(module, devices, detach=True)
        else:
            replicas = self.mirror_module(module, devices)
        return dict(zip(devices, replicas))
