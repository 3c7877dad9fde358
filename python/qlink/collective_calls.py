"""The Context's collectives over lists of torch tensors, one per device, in process:
broadcast (replicas), reduce (GPTQ Hessian partials, deterministic) and all_reduce
(SignRound gradients: sum / avg / sign, fp32 or bf16 transport). collectives.py has
their module-level forms and the prepared all-reduce.

Each device's part is ordered on that device's current stream, like the copies."""
import ctypes

from . import _abi
from ._dlpack import pack
from .streams import current_streams


def current_stream_list(ctx, devices):
    """The current streams of `devices` as (array, count); none on a host-memory backend."""
    if ctx.cpu_memory:
        return None, 0
    return ctx.stream_list(current_streams(ctx, devices))


def all_reduce_args(ctx, buffers, op, transport, devices, algorithm, streams):
    for name, value, choices in (("op", op, _abi.REDUCE_OPS), ("transport", transport, _abi.TRANSPORTS),
                                 ("algorithm", algorithm, _abi.ALL_REDUCE_ALGORITHMS)):
        if value not in choices:
            raise ValueError("%s must be one of %s, got %r" % (name, sorted(choices), value))
    bufs = pack(buffers, devices, exact=True)
    array, n = current_stream_list(ctx, bufs.devices) if streams else (None, 0)
    args = _abi.AllReduceArgs(ctypes.sizeof(_abi.AllReduceArgs), bufs.pointer, bufs.count, _abi.REDUCE_OPS[op],
                              _abi.TRANSPORTS[transport], array, n, _abi.ALL_REDUCE_ALGORITHMS[algorithm])
    return args, (bufs, array)  # the second keeps what args points into alive


class CollectiveCalls:
    """In-process collectives; part of Context."""

    def broadcast(self, sources, replicas, source_device=None, replica_devices=None, sources_ready=False,
                  sources_held=False, wait=False):
        """replicas[r][i].copy_(sources[i]) for every replica r, relayed along a binary tree
        of peer links. source_device / replica_devices override device indices (CPU virtual
        devices); sources_ready / sources_held as for copy(), for the sources; wait: return
        once every replica holds the data."""
        n = len(sources)
        for r in replicas:
            if len(r) != n:
                raise ValueError("every replica needs %d leaves, one has %d" % (n, len(r)))
        src = pack(sources, None if source_device is None else [source_device] * n)
        ids = None if replica_devices is None else [d for d in replica_devices for _ in range(n)]
        dst = pack([t for r in replicas for t in r], ids)
        args = _abi.BroadcastArgs(ctypes.sizeof(_abi.BroadcastArgs), src.pointer, n, dst.pointer, len(replicas),
                                  *current_stream_list(self, src.devices | dst.devices),
                                  _abi.copy_flags(sources_ready, sources_held, wait))
        self.invoke("broadcast", ctypes.byref(args))

    def reduce(self, inputs, output, scale=1.0, input_devices=None, output_device=None):
        """output = scale * sum(inputs), summed in device-index order whatever the order of
        `inputs` (bit-identical for every arrival order). fp32, one input per device; the
        output may be the input of its own device."""
        src = pack(inputs, input_devices, exact=True)
        out = pack([output], None if output_device is None else [output_device], exact=True)
        args = _abi.ReduceArgs(ctypes.sizeof(_abi.ReduceArgs), src.pointer, src.count, out.pointer, float(scale),
                               *current_stream_list(self, src.devices | out.devices))
        self.invoke("reduce", ctypes.byref(args))

    def all_reduce(self, buffers, op="sum", transport="fp32", devices=None, algorithm="auto"):
        """Every buffer becomes op(sum of buffers) in place; op: sum | avg | sign, transport:
        fp32 | bf16, algorithm: auto | two_shot | halving_doubling. All buffers end
        bit-identical."""
        args, _keep = all_reduce_args(self, buffers, op, transport, devices, algorithm, streams=True)
        self.invoke("all_reduce", ctypes.byref(args))
