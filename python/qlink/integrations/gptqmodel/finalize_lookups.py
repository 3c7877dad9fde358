"""GPTQModel's finalize of a module finds that one module by walking the whole model, three
times: GPTQProcessor.submodule_finalize builds find_modules(model.model) and
find_modules(model.model, [qlinear_kernel]) and reads one entry of each, and
offload_to_disk names it by get_module_fullname's walk of named_modules. An MoE model's
walk visits every expert linear of every layer, so a layer's finalizes cost O(model) each:
quadratic in the layer count, and hidden by runs of a few layers (docs/MOE.md). Here each
finalize's lookups go down the module's own path, and the offload is told the name of the
module its finalize made.

Invariant: submodule_finalize reads the same entries (contract.finalized_entry; an
ancestor of the module of the looked-for types, or a lookup off the module's path, takes
the host's walk), and get_module_fullname returns the same name (a remembered name is
used only where it still leads to the module). Any other call is the host's."""
import threading
import weakref

from ..patches import like
from .contract import along, finalized_entry, leads_to

PATCH = "finalize_lookups"


class FinalizeLookups:
    """The lookups' shared state: the module each finalizer thread is finalizing, and the
    names of the modules finalizes made (until their offload asks for them)."""

    def __init__(self, counters, supported_types):
        self.counters, self.supported_types = counters, supported_types  # the host's list, read at each call
        self._finalizing = threading.local()
        self._lock = threading.Lock()
        self._names = weakref.WeakKeyDictionary()  # a finalized module -> its path under the model

    def make_submodule_finalize(self, original):
        @like(original)
        def submodule_finalize(processor, module, model, **kwargs):
            root, path = getattr(model, "model", None), getattr(module, "full_name", None)
            if root is None or not path:
                self.counters.host(PATCH, "a module without a full name or a model without .model")
                return original(processor, module, model, **kwargs)
            self._finalizing.at = (root, path)
            try:
                result = original(processor, module, model, **kwargs)
            finally:
                self._finalizing.at = None
            made = along(root, path)
            if made is not None:
                with self._lock:
                    self._names[made] = path
            self.counters.qlink(PATCH)
            return result
        return submodule_finalize

    def make_find_modules(self, original):
        @like(original)
        def find_modules(module, layers=None, name=""):
            at = getattr(self._finalizing, "at", None)
            if at is not None and module is at[0] and name == "":
                found = finalized_entry(module, at[1], tuple(layers or self.supported_types))
                if found is not None:
                    return found
            return original(module, layers, name)
        return find_modules

    def make_get_module_fullname(self, original):
        @like(original)
        def get_module_fullname(model, module):
            with self._lock:
                path = self._names.pop(module, None)
            if path is not None and leads_to(model, path, module):
                return path
            return original(model, module)
        return get_module_fullname
