"""PreparedCopy: a batch validated and planned once (Context.prepare, copy_calls.py) and
replayed on the current streams, on a context or the process default one."""
from .copy_calls import bridged_replay
from .defaults import default_context
from .streams import current_streams_for, streams_key


class PreparedCopy:
    """A batch validated and planned once, replayed with run() on the current streams
    (replica mirrors, calibration staging). Holds its tensors so they outlive the plan.

    Each run() is ordered like peer_copy_batch unless the caller takes part of it over:
    sources_held=True when the sources stay unmodified until the copy has completed (frozen
    weights mirrored again and again): later work on the source devices then does not wait
    for the copy; sources_ready=True when their producers are already ordered before the
    destination streams. wait=True: each run() returns once the targets hold the data."""

    def __init__(self, sources, targets, ctx=None, sources_ready=False, sources_held=False, wait=False):
        self._ctx = ctx or default_context()
        self._plan = self._ctx.prepare(sources, targets, sources_ready=sources_ready, sources_held=sources_held,
                                       wait=wait)
        self._execute = self._ctx.function("copy_plan_execute")
        self._handle = self._plan._handle
        self._streams_key = streams_key(self._ctx.device_type, self._plan.stream_devices)
        bridged = bridged_replay(self._ctx, self._ctx.function_address("copy_plan_execute"), self._handle.value,
                                 self._streams_key)
        if bridged is not None:
            self.run = bridged

    def run(self):
        streams = current_streams_for(self._streams_key)
        status = self._execute(self._handle, streams.pointer, streams.count)
        if status:
            self._ctx.check(status)
