"""A layer child's last linear's input, kept to answer the child's next run with that linear
alone. GPTQModel's o_proj subset forward runs the attention block up to o_proj, whose input
then holds all of q/k/v's and SDPA's work; gate/up's forward runs the block again with only
o_proj changed. down_proj's forward runs the MLP up to down_proj; the replay runs it again
with only down_proj changed. So the block's o_proj input (from o_proj's forward) answers
gate/up's forward as o_proj of it, and the MLP's down_proj input (from down's forward)
answers the replay as down_proj of it: about two fifths of a 7B layer's attention work and
half its replay's MLP.

Invariant: a child answers from its last linear's kept input only where (1) the same layer
call (the key attention_outputs.py makes), the same children run before it and the same
tensors in the child but its last linear's (module_state.signature) show that input would be
the same, (2) no hook but qlink's is on or in the child, and (3) a whole run of the child,
the first one after the input was kept, returned that linear's output itself (or it first in
a tuple of Nones) and gave the linear the very bytes kept (one comparison a child a layer).
Then the answer is the linear's output on those bytes: the whole run's, bit for bit."""
import threading

import torch

from ...moves import nbytes
from .module_state import OwnHook, hooked, kept_answers

PATCH = "tail_inputs"


class _Call:
    """One run of the child: its key (and the weak references it holds while) and signature,
    the last linear's input and output seen."""
    __slots__ = ("key", "refs", "signature", "x", "out")

    def __init__(self, key, refs, signature):
        self.key, self.refs, self.signature, self.x, self.out = key, refs, signature, None, None


class _In(OwnHook):
    def __init__(self, tail):
        self.tail = tail

    def __call__(self, module, inputs):
        call = getattr(self.tail.local, "call", None)
        if call is not None and inputs and torch.is_tensor(inputs[0]):
            call.x = inputs[0]
            self.tail.keep(call)


class _Out(OwnHook):
    def __init__(self, tail):
        self.tail = tail

    def __call__(self, module, inputs, output):
        call = getattr(self.tail.local, "call", None)
        if call is not None:
            call.out = output


class Tail:
    """One child's kept last-linear inputs by key, and whether the child answers with them.
    take(bytes) -> bool: whether the layer's budget holds that many more."""

    def __init__(self, child, last_name, counters, take):
        self.child, self.last_name, self.counters, self.take = child, last_name, counters, take
        self.kept = {}  # key -> (input, signature, the key's weak references)
        self.answers = None  # the child's output form once checked ("tensor" or a tuple's length), False if not
        self.local = threading.local()
        self.handles, self.on = [], None

    def track(self):
        """The hooks on the child's current last linear (GPTQModel swaps it after pre_quantize)."""
        last = getattr(self.child, self.last_name, None)
        if last is not self.on:
            self.untrack()
            if last is not None:
                self.handles = [last.register_forward_pre_hook(_In(self)), last.register_forward_hook(_Out(self))]
            self.on = last

    def untrack(self):
        for handle in self.handles:
            handle.remove()
        self.handles, self.on = [], None

    def run(self, key, refs, signature, run_child):
        """The child's output for this call: its last linear of the kept input where that
        answers (see the module's docstring), else the child's own run."""
        kept = self.kept.get(key)
        same = _answers(kept, signature)
        if self.answers and same and not hooked(self.child):
            self.counters.qlink(PATCH)
            out = getattr(self.child, self.last_name)(kept[0].clone())
            return out if self.answers == "tensor" else (out,) + (None,) * (self.answers - 1)
        call = _Call(key, refs, signature)
        previous, self.local.call = getattr(self.local, "call", None), call
        try:
            output = run_child()
        finally:
            self.local.call = previous
        if self.answers is None and same and call.out is not None:
            form = _form(output, call.out)
            self.answers = form if form is not None and torch.equal(call.x, kept[0]) else False
            self.counters.host(PATCH, "checked against a whole run" if self.answers else
                               "the child's output is not its last linear's of the kept input")
        return output

    def keep(self, call):
        kept = self.kept.get(call.key)
        if _answers(kept, call.signature):
            return  # a whole run's input, to compare with it
        if not self.take(nbytes([call.x]) - (nbytes([kept[0]]) if kept is not None else 0)):
            self.counters.host(PATCH, "over the layer's budget (a quarter of the GPU's free memory)")
            return
        self.kept[call.key] = (call.x.detach().clone(), call.signature, call.refs)
        self.counters.host(PATCH, "kept (its inputs or weights new)")

    def clear(self):
        self.untrack()
        self.kept.clear()


def _form(output, last_output):
    """"tensor" where `output` is the last linear's output itself, the tuple's length where it
    comes first in a tuple of Nones, else None."""
    if output is last_output:
        return "tensor"
    if isinstance(output, tuple) and output and output[0] is last_output and all(o is None for o in output[1:]):
        return len(output)
    return None


def _answers(kept, signature):
    """Whether a kept (input, signature, refs) is this call's."""
    return kept is not None and kept_answers(kept[1], kept[2], signature)
