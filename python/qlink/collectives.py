"""Collectives over lists of torch tensors, one per device, in process: broadcast and
mirror_module (replicas), reduce (GPTQ Hessian partials, deterministic) and all_reduce
(SignRound gradients: sum / avg / sign, fp32 or bf16 transport).

Each device's part is ordered on that device's current stream, like the copies."""
import copy
import ctypes

import torch

from . import _abi
from ._dlpack import pack
from .p2p import _bridged_replay, _streams_key, current_streams, default_context


def _streams(ctx, devices):
    if ctx._device_type == _abi.KDL_CPU:  # host memory (CPU and test backends): no torch streams
        return None, 0
    return ctx._streams(current_streams(ctx, devices))


def broadcast(sources, replicas, ctx=None, source_device=None, replica_devices=None, sources_ready=False,
              sources_held=False, wait=False):
    """replicas[r][i].copy_(sources[i]) for every replica r, relayed along a binary tree of
    peer links. source_device / replica_devices override device indices (CPU virtual
    devices); sources_ready / sources_held as for qlink.Context.copy, for the sources;
    wait: return once every replica holds the data."""
    ctx = ctx or default_context()
    n = len(sources)
    src = pack(sources, None if source_device is None else [source_device] * n)
    flat = [t for r in replicas for t in r]
    ids = None if replica_devices is None else [d for d in replica_devices for _ in range(n)]
    dst = pack(flat, ids)
    for r in replicas:
        if len(r) != n:
            raise ValueError("every replica needs %d leaves, one has %d" % (n, len(r)))
    args = _abi.BroadcastArgs(ctypes.sizeof(_abi.BroadcastArgs), src.pointer, n, dst.pointer, len(replicas),
                              *_streams(ctx, src.devices | dst.devices),
                              _abi.copy_flags(sources_ready, sources_held, wait))
    ctx._check(ctx._api.broadcast(ctx._handle, ctypes.byref(args)))


def reduce(inputs, output, scale=1.0, ctx=None, input_devices=None, output_device=None):
    """output = scale * sum(inputs), summed in device-index order whatever the order of
    `inputs` (bit-identical for every arrival order). fp32, one input per device."""
    ctx = ctx or default_context()
    src = pack(inputs, input_devices, exact=True)
    out = pack([output], None if output_device is None else [output_device], exact=True)
    args = _abi.ReduceArgs(ctypes.sizeof(_abi.ReduceArgs), src.pointer, src.count, out.pointer, float(scale),
                           *_streams(ctx, src.devices | out.devices))
    ctx._check(ctx._api.reduce(ctx._handle, ctypes.byref(args)))


def _all_reduce_args(ctx, buffers, op, transport, devices, algorithm, streams):
    for name, value, choices in (("op", op, _abi.REDUCE_OPS), ("transport", transport, _abi.TRANSPORTS),
                                 ("algorithm", algorithm, _abi.ALL_REDUCE_ALGORITHMS)):
        if value not in choices:
            raise ValueError("%s must be one of %s, got %r" % (name, sorted(choices), value))
    bufs = pack(buffers, devices, exact=True)
    array, n = _streams(ctx, bufs.devices) if streams else (None, 0)
    args = _abi.AllReduceArgs(ctypes.sizeof(_abi.AllReduceArgs), bufs.pointer, bufs.count, _abi.REDUCE_OPS[op],
                              _abi.TRANSPORTS[transport], array, n, _abi.ALL_REDUCE_ALGORITHMS[algorithm])
    return args, (bufs, array)  # the second keeps what args points into alive


def all_reduce(buffers, op="sum", transport="fp32", ctx=None, devices=None, algorithm="auto"):
    """Every buffer becomes op(sum of buffers) in place; op: sum | avg | sign, transport:
    fp32 | bf16, algorithm: auto | two_shot | halving_doubling. All buffers end
    bit-identical."""
    ctx = ctx or default_context()
    args, _keep = _all_reduce_args(ctx, buffers, op, transport, devices, algorithm, streams=True)
    ctx._check(ctx._api.all_reduce(ctx._handle, ctypes.byref(args)))


class PreparedAllReduce:
    """all_reduce over fixed buffers, validated once and replayed with run() (a tuning
    loop's gradients every iteration). Holds the buffers so they outlive the plan."""

    def __init__(self, buffers, op="sum", transport="fp32", ctx=None, devices=None, algorithm="auto"):
        self._ctx = ctx or default_context()
        self.buffers = list(buffers)
        args, keep = _all_reduce_args(self._ctx, self.buffers, op, transport, devices, algorithm, streams=False)
        plan = ctypes.c_void_p()
        self._ctx._check(self._ctx._api.all_reduce_plan_create(self._ctx._handle, ctypes.byref(args),
                                                               ctypes.byref(plan)))
        self._handle = plan
        self._devices = keep[0].devices
        self._execute = self._ctx._api.all_reduce_plan_execute
        bridged = _bridged_replay(self._ctx, self._ctx._all_reduce_plan_execute_fn, plan.value,
                                  _streams_key(self._ctx, self._devices))
        if bridged is not None:
            self.run = bridged

    def run(self):
        streams, count = _streams(self._ctx, self._devices)
        status = self._execute(self._handle, streams, count)
        if status:
            self._ctx._check(status)

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and self._ctx._handle:
            self._ctx._api.all_reduce_plan_destroy(handle)

    __del__ = close


def mirror_module(module, devices, ctx=None):
    """Independent replicas of `module` on `devices` (no storage shared with the source or
    each other), weights broadcast through qlink."""
    leaves = []
    for m in module.modules():
        leaves += [t for t in list(m._parameters.values()) + list(m._buffers.values()) if t is not None]
    unique = list({id(t): t for t in leaves}.values())
    fast = [t for t in unique if t.is_cuda and t.is_contiguous()]
    fast_ids = {id(t) for t in fast}
    replicas, targets = [], []
    for device in devices:
        device = torch.device(device)
        memo, fresh = {}, []
        for t in unique:
            new = torch.empty(t.shape, dtype=t.dtype, device=device)
            if id(t) in fast_ids:
                fresh.append(new)
            else:
                new.copy_(t)  # the regular path: host or non-contiguous leaves
            memo[id(t)] = torch.nn.Parameter(new, t.requires_grad) if isinstance(t, torch.nn.Parameter) else new
        replicas.append(copy.deepcopy(module, memo))
        targets.append(fresh)
    if fast:
        broadcast(fast, targets, ctx=ctx)
    return replicas
