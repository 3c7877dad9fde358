"""GPTQModel's lazy fill names each module it fills by a walk of the whole model
(structure._get_qualified_name: named_modules until the module), once or twice a fill: a
layer's, and each subset module's that GPTQModel fills for a forward. A walk visits every
expert of every layer (docs/MOE.md). Here the names come from an index of the model's
modules made by one such walk, made again when asked for a module it does not hold (one
made since).

Invariant: the name is the host's for a module held at one place: the index keeps the
first path named_modules gives each module, and a name is used only while it still leads
to its module (contract.leads_to); the root and a module not in the model get the host's
walk and its error."""
import threading
import weakref

from ..patches import like
from .contract import leads_to

PATCH = "qualified_names"


class QualifiedNames:
    """original: the host's _get_qualified_name; qualified_name() the indexed one."""

    def __init__(self, counters, original):
        self.counters, self.original = counters, original
        self._lock = threading.Lock()
        self._index = weakref.WeakKeyDictionary()  # model -> {module: its first path} (weak keys)

    def make(self, original):
        @like(original)
        def _get_qualified_name(root, obj):
            return self.qualified_name(root, obj)
        return _get_qualified_name

    def qualified_name(self, root, obj):
        path = self._known(root, obj)
        if path is None:
            path = self._indexed(root, obj)
        if path is None:
            self.counters.host(PATCH, "the model itself or a module not in it")
            return self.original(root, obj)
        self.counters.qlink(PATCH)
        return path

    def _known(self, root, obj):
        with self._lock:
            index = self._index.get(root)
            path = index.get(obj) if index is not None else None
        return path if path is not None and leads_to(root, path, obj) else None

    def _indexed(self, root, obj):
        """The model indexed again by one walk (named_modules: each module's first path);
        obj's path in it, or None."""
        index = weakref.WeakKeyDictionary((module, name) for name, module in root.named_modules() if name)
        with self._lock:
            self._index[root] = index
        return index.get(obj)
