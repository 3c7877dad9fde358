"""A host's loop run with a short interpreter switch interval (sys.setswitchinterval),
the previous interval back when the outermost such loop returns.

PyTorch releases the GIL around every operator it dispatches and takes it back when the
operator has been queued. A thread that wants the GIL while another thread runs Python code
waits for that thread to yield it, which it does only once the switch interval has passed:
5 ms by default. GPTQModel's finalizer threads run Python (packing, offloading, bookkeeping)
while the main thread launches a layer's forwards one small operator at a time, each a few
microseconds of GPU work; every operator's return can then wait up to the whole interval,
and the GPU waits with it (on the issue's model, about a quarter of the 4-layer loop idle
with the main thread inside the forwards). Measured on a CPU here with two threads running
Python: 45 operators a second at 5 ms, 8000 at 0.1 ms, 184000 alone. A short interval costs
the Python threads a few more handovers; on a free-threaded build there is no GIL to hand
over and the interval changes nothing."""
import contextlib
import sys
import threading

_lock = threading.Lock()
_depth = 0  # loops inside a short interval of ours, over every thread
_saved = None  # (the interval before ours, ours) while _depth > 0


def check_interval(seconds):
    """seconds if it is None or a positive number of seconds, else ValueError naming it."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 1:
        raise ValueError("switch_interval must be None or seconds in (0, 1), got %r" % (seconds,))
    return float(seconds)


def _set(seconds):
    # The interpreter keeps whole microseconds, truncating: 1e-4 would come back 99 us and
    # a restored interval one microsecond short of what it was.
    sys.setswitchinterval((round(seconds * 1e6) + 0.5) / 1e6)


@contextlib.contextmanager
def short_switch_interval(seconds):
    """Runs the body with sys.setswitchinterval(seconds) where the interval is longer;
    yields None when the interval is ours, else why not. The first of nested or concurrent
    calls sets it and the last restores the one before, unless something else has changed
    it since (then theirs stays)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            before = sys.getswitchinterval()
            if seconds < before:
                _set(seconds)
            _saved = (before, sys.getswitchinterval())
        _depth += 1
        reason = None if _saved[1] < _saved[0] else "the interval is already %g s" % _saved[0]
    try:
        yield reason
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if _saved[1] != _saved[0] and sys.getswitchinterval() == _saved[1]:
                    _set(_saved[0])
                _saved = None
