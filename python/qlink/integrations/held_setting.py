"""A process-wide setting held while loops run inside it: the first of nested or concurrent
holders makes it and the last one out undoes it (host_switch.py, host_allocator.py)."""
import contextlib
import threading


class HeldSetting:
    """make(*args) -> state, by the first holder; reason(state) -> None where the setting is
    held, else why not, told to every holder; undo(state) when the last holder leaves."""

    def __init__(self, make, reason, undo):
        self._make, self._reason, self._undo = make, reason, undo
        self._lock = threading.Lock()
        self._depth = 0  # holders inside, over every thread
        self._state = None  # the first holder's make(), while _depth > 0

    @contextlib.contextmanager
    def held(self, *args):
        """Runs the body inside the setting; yields reason(state)."""
        with self._lock:
            if self._depth == 0:
                self._state = self._make(*args)
            self._depth += 1
            reason = self._reason(self._state)
        try:
            yield reason
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._undo(self._state)
                    self._state = None
