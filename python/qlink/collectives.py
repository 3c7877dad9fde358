"""The Context's collectives over lists of torch tensors, one per device, in process:
broadcast (replicas), reduce (GPTQ Hessian partials, deterministic) and all_reduce
(SignRound gradients: sum / avg / sign, fp32 or bf16 transport); and their module-level
forms on the default context.

Each device's part is ordered on that device's current stream, like the copies."""
import ctypes

from . import _abi
from ._dlpack import pack
from .defaults import default_context
from .copies import bridged_replay
from .streams import current_streams, streams_key


def _streams(ctx, devices):
    """The current streams of `devices` as (array, count); none on a host-memory backend."""
    if ctx.host_memory:
        return None, 0
    return ctx.stream_list(current_streams(ctx, devices))


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
                                  *_streams(self, src.devices | dst.devices),
                                  _abi.copy_flags(sources_ready, sources_held, wait))
        self.invoke("broadcast", ctypes.byref(args))

    def reduce(self, inputs, output, scale=1.0, input_devices=None, output_device=None):
        """output = scale * sum(inputs), summed in device-index order whatever the order of
        `inputs` (bit-identical for every arrival order). fp32, one input per device; the
        output may be the input of its own device."""
        src = pack(inputs, input_devices, exact=True)
        out = pack([output], None if output_device is None else [output_device], exact=True)
        args = _abi.ReduceArgs(ctypes.sizeof(_abi.ReduceArgs), src.pointer, src.count, out.pointer, float(scale),
                               *_streams(self, src.devices | out.devices))
        self.invoke("reduce", ctypes.byref(args))

    def all_reduce(self, buffers, op="sum", transport="fp32", devices=None, algorithm="auto"):
        """Every buffer becomes op(sum of buffers) in place; op: sum | avg | sign, transport:
        fp32 | bf16, algorithm: auto | two_shot | halving_doubling. All buffers end
        bit-identical."""
        args, _keep = _all_reduce_args(self, buffers, op, transport, devices, algorithm, streams=True)
        self.invoke("all_reduce", ctypes.byref(args))

    def prepare_all_reduce(self, buffers, op="sum", transport="fp32", devices=None, algorithm="auto"):
        """A PreparedAllReduce of this context."""
        return PreparedAllReduce(buffers, op, transport, ctx=self, devices=devices, algorithm=algorithm)


class PreparedAllReduce:
    """all_reduce over fixed buffers, validated once and replayed with run() (a tuning
    loop's gradients every iteration). Holds the buffers so they outlive the plan."""

    def __init__(self, buffers, op="sum", transport="fp32", ctx=None, devices=None, algorithm="auto"):
        self._ctx = ctx or default_context()
        self.buffers = list(buffers)
        args, keep = _all_reduce_args(self._ctx, self.buffers, op, transport, devices, algorithm, streams=False)
        plan = ctypes.c_void_p()
        self._ctx.invoke("all_reduce_plan_create", ctypes.byref(args), ctypes.byref(plan))
        self._handle = plan
        self._devices = keep[0].devices
        self._execute = self._ctx.function("all_reduce_plan_execute")
        bridged = bridged_replay(self._ctx, self._ctx.function_address("all_reduce_plan_execute"), plan.value,
                                 streams_key(self._ctx.device_type, self._devices))
        if bridged is not None:
            self.run = bridged

    def run(self):
        streams, count = _streams(self._ctx, self._devices)
        status = self._execute(self._handle, streams, count)
        if status:
            self._ctx.check(status)

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and not self._ctx.closed:
            self._ctx.function("all_reduce_plan_destroy")(handle)

    __del__ = close


# The module-level forms: the same calls on `ctx`, the process default context if None.

def broadcast(sources, replicas, ctx=None, source_device=None, replica_devices=None, sources_ready=False,
              sources_held=False, wait=False):
    return (ctx or default_context()).broadcast(sources, replicas, source_device, replica_devices, sources_ready,
                                                sources_held, wait)


def reduce(inputs, output, scale=1.0, ctx=None, input_devices=None, output_device=None):
    return (ctx or default_context()).reduce(inputs, output, scale, input_devices, output_device)


def all_reduce(buffers, op="sum", transport="fp32", ctx=None, devices=None, algorithm="auto"):
    return (ctx or default_context()).all_reduce(buffers, op, transport, devices, algorithm)


def mirror_module(module, devices, ctx=None):
    return (ctx or default_context()).mirror_module(module, devices)
