"""A stopped subset's products no one reads, left uncomputed. GPTQModel's forward of a
subset hooks each of the subset's linears and raises StopForward right after the last one's
hook (forward_hook_last), and GPTQ's hook reads its module's input alone (add_batch ignores
the output). So the last module's product reaches nothing, and on a LLaMA layer neither do
the others' (q_proj and k_proj before v_proj, gate_proj before up_proj): what they feed runs
before the stop and is dropped with it. A LLaMA-7B layer's four subset forwards compute
seven such products a batch.

Invariant: only a product no hooked input can depend on is left out. The last module's
always. Another hooked module's where, in an earlier batch of the same subset (the same hook
object), every hooked module that ran was given the very tensor the last one was given: no
hooked input then came from another's output, and each batch runs the same code. Left out
only in a loop with GPTQ's processor alone (GPTQLoop); the product is an uncomputed tensor of
its shape and dtype, the module's other steps as HookedLinear.forward's
(contract.unproduced_forward); any other call is GPTQModel's."""
import threading
import weakref

import torch

from ..patches import like
from .contract import unproduced_forward

PATCH = "stopped_products"


class StoppedProducts:
    """The hooked modules of this thread's current subset forward and their inputs, until its
    last module runs; and, per hook object, the modules whose products its subset leaves out."""

    def __init__(self):
        self.local = threading.local()
        self.lock = threading.Lock()
        self.unread = weakref.WeakKeyDictionary()  # a module's hook -> True: its product is read by no one

    def ran(self, module, input):
        pending = getattr(self.local, "pending", None)
        if pending is None:
            pending = self.local.pending = []
        pending.append((module, weakref.ref(input)))  # the very tensor: an address may be reused

    def stopped(self, input):
        """The subset's last module runs: the modules before it are marked where each of them
        was given its input."""
        pending, self.local.pending = getattr(self.local, "pending", None) or [], []
        if pending and all(given() is input for _, given in pending):
            with self.lock:
                for module, _ in pending:
                    try:
                        self.unread[module.forward_hook] = True
                    except TypeError:  # a hook no weak reference can hold: its module keeps computing
                        pass

    def read_by_no_one(self, module):
        with self.lock:
            try:
                return self.unread.get(module.forward_hook, False)
            except TypeError:
                return False


def make_forward(installation, original):
    """HookedLinear.forward for `installation` (qlink.integrations.gptqmodel's)."""
    counters, helpers, stopped = installation.counters, installation.host.hooked_linear, StoppedProducts()

    @like(original)
    def forward(module, input):
        if not getattr(module, "forward_hook", None):
            return original(module, input)
        if installation.loop.refusal:
            counters.host(PATCH, installation.loop.refusal)
            return original(module, input)
        if module.forward_hook_last:
            stopped.stopped(input)
        elif stopped.read_by_no_one(module):
            pass
        else:
            stopped.ran(module, input)
            return original(module, input)
        counters.qlink(PATCH)
        with torch.inference_mode():
            return unproduced_forward(module, input, helpers)
    return forward
