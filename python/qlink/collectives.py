"""The collectives' module-level forms (broadcast, reduce, all_reduce, mirror_module: the
Context's calls of collective_calls.py and replicas.py on `ctx`, the process default
context if None) and PreparedAllReduce, an all-reduce validated once and replayed."""
import ctypes

from .collective_calls import all_reduce_args, current_stream_list
from .copy_calls import bridged_replay
from .defaults import default_context
from .streams import streams_key


class PreparedAllReduce:
    """all_reduce over fixed buffers, validated once and replayed with run() (a tuning
    loop's gradients every iteration). Holds the buffers so they outlive the plan."""

    def __init__(self, buffers, op="sum", transport="fp32", ctx=None, devices=None, algorithm="auto"):
        self._ctx = ctx or default_context()
        self.buffers = list(buffers)
        args, keep = all_reduce_args(self._ctx, self.buffers, op, transport, devices, algorithm, streams=False)
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
        streams, count = current_stream_list(self._ctx, self._devices)
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
