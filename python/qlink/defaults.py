"""The process-wide default context the module-level functions use."""
import threading

from .context import Context

_default = None
_lock = threading.Lock()


def configure(config=None, library=None):
    """Installs a new process-wide default context (config and library as for qlink.load)."""
    global _default
    ctx = Context(config, library)
    with _lock:
        _default = ctx
    return ctx


def default_context():
    """The process-wide default context, created with the default config on first use."""
    global _default
    with _lock:
        if _default is None:
            _default = Context()
        return _default
