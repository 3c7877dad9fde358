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
import sys

from .held_setting import HeldSetting


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


def _shorten(seconds):
    before = sys.getswitchinterval()
    if seconds < before:
        _set(seconds)
    return before, sys.getswitchinterval()


def _restore(saved):
    before, ours = saved
    if ours != before and sys.getswitchinterval() == ours:
        _set(before)


def _why_not(saved):
    before, ours = saved
    return None if ours < before else "the interval is already %g s" % before


_HELD = HeldSetting(_shorten, _why_not, _restore)


def short_switch_interval(seconds):
    """Runs the body with sys.setswitchinterval(seconds) where the interval is longer;
    yields None when the interval is ours, else why not. The first of nested or concurrent
    calls sets it and the last restores the one before, unless something else has changed
    it since (then theirs stays)."""
    return _HELD.held(seconds)
