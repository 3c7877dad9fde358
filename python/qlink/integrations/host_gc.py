"""A host's quantize call with the objects that existed before it frozen out of Python's
cyclic garbage collector (gc.freeze), and unfrozen when the outermost such call returns.

AutoRound clears memory between blocks with a full gc.collect() (12 to 15 per run of two
blocks), each of which walks every object the process holds: transformers, torch and
torch.compile's state, about 0.38 s a call on the issue's model, with the GPU idle since it
synchronized first. Frozen, those objects are skipped; garbage made during the call (what
the host's clearing is for) is collected as before. The unfreeze at the end returns every
frozen object to the collector, including any the process froze before the call (torch or
a library may have): left frozen, a cycle among the model's objects could never be
collected after the run."""
import contextlib
import gc
import threading

_lock = threading.Lock()
_depth = 0  # calls inside a freeze of ours, over every thread
_ours = False  # whether the current freeze is ours


@contextlib.contextmanager
def frozen_gc():
    """Yields None when the call runs with the older objects frozen, else why not."""
    global _depth, _ours
    with _lock:
        if _depth == 0:
            _ours = gc.isenabled()
            if _ours:
                gc.freeze()
        _depth += 1
        reason = None if _ours else "the collector is disabled"
    try:
        yield reason
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _ours:
                gc.unfreeze()
                _ours = False
