"""A decoder layer's attention block's outputs, kept across the layer's forwards.

GPTQModel runs a layer's forward once for each subset it quantizes (stopping after the
subset's last module), then once more whole for the next layer's inputs. Once q/k/v/o are
quantized, each later forward (gate/up's, down's, the replay; an MoE layer's expert stage)
runs the attention block on the same inputs with the same weights, making the same bytes:
on a LLaMA-7B layer two of the block's runs, a quarter of the layer's forward GEMMs. From
the layer's pre_quantize to its post_quantize, a run of the block records a copy of its
output per calibration batch, and a later run returns a copy of the record when nothing it
depends on changed; otherwise the block runs (and its new output is recorded). The same
attachment keeps the block's and the MLP's last-linear inputs (tail_inputs.py).

Invariant, what "nothing changed" means: the same layer call (every tensor the layer is
given, and every one the block is given but its hidden states, is the same tensor: at the
same address and alive since the record, as GPTQModel's cached batches are where the cache
is on the GPU; a batch moved anew each forward may land where a freed one was, and is not
the same; the block's n-th call in it), the same children of the layer
run before the block, with the same parameters and buffers (the same tensors at the same
address and version), the block's own likewise, no hook on or in the block but qlink's (a
subset being calibrated), no argument holding state of its own, autograd off. The block's
hidden states are a function of the layer's input and the children that ran before it, so
its output is the record's, bit for bit. A weight written in place keeps its address: only
its version says so, and GPTQModel's loop runs in inference mode, where tensors keep none.
So outputs are kept only inside a loop whose processors are all GPTQProcessor, which
replaces a quantized module's weight tensor (AWQ's and QQQ's write in place; GPTQLoop).
Each layer's records stay within a quarter of its GPU's free memory. Off where the forwards
run on replicas (more than one GPU)."""
import itertools
import threading
import types

import torch

from ...moves import map_nested, nbytes, nested_tensors
from ..patches import like
from .module_state import OwnHook, hooked, kept_answers, plain, signature, tensor_keys, tensor_refs
from .tail_inputs import Tail

PATCH = "attention_outputs"
BLOCK_NAMES = ("self_attn", "attn", "self_attention", "attention")  # the decoder layers' attention child
MLP_NAME = "mlp"  # the dense MLP child
LAST_LINEARS = ("o_proj", "down_proj")  # the block's and the MLP's, whose inputs tail_inputs keeps
BUDGET_SHARE = 4  # a layer's records take at most 1/BUDGET_SHARE of its GPU's free memory


def attention_block(layer):
    """The attention child of a decoder layer, or None."""
    children = dict(layer.named_children())
    return next((children[name] for name in BLOCK_NAMES if name in children), None)


class _Ran(OwnHook):
    """The hook that lists a child as it runs in an attached layer's call."""

    def __init__(self, outputs):
        self.outputs = outputs

    def __call__(self, module, inputs):
        current = getattr(self.outputs.local, "current", None)
        if current is not None:
            current.ran.append(module)


class _LayerCall:
    """An attached layer's call on this thread: its tensors' key and weak references, the
    children run so far, how many times each wrapped child has been called."""
    __slots__ = ("layer", "key", "refs", "ran", "calls")

    def __init__(self, layer, tensors):
        self.layer, self.ran, self.calls = layer, [], {}
        self.key, self.refs = tensor_keys(tensors), tensor_refs(tensors)

    def next_key(self, child, others):
        """(the child's call key, weak references of the tensors it was made from)."""
        self.calls[id(child)] = self.calls.get(id(child), 0) + 1  # a layer may call a child twice
        tensors = nested_tensors(others)
        return self.key + (id(child), self.calls[id(child)]) + tensor_keys(tensors), self.refs + tensor_refs(tensors)

    def ran_before(self, child):
        return tuple(m for m in self.ran if m is not child)


class _Layer:
    """One attached layer: its block (and dense MLP), the forwards replaced, the records, the
    tails and the hooks that list the children run in each call."""

    def __init__(self, outputs, layer, block, budget, tails):
        self.outputs, self.layer, self.block, self.budget = outputs, layer, block, budget
        self.records, self.held = {}, 0
        self.handles, self.tracked = [], ()
        mlp = dict(layer.named_children()).get(MLP_NAME)
        self.tails = {}
        for child, last in zip((block, mlp), LAST_LINEARS) if tails else ():
            if isinstance(getattr(child, last, None), torch.nn.Module):
                self.tails[id(child)] = Tail(child, last, outputs.counters, self.take)
        self.mlp = mlp if id(mlp) in self.tails else None
        self.forwards = {}
        for module, wrapper in ((layer, _layer_forward), (block, _child_forward), (self.mlp, _child_forward)):
            if module is not None:
                self.forwards[id(module)] = (module, module.forward)
                module.forward = types.MethodType(wrapper, module)

    def forward_of(self, module):
        return self.forwards[id(module)][1]

    def take(self, nbytes_more):
        """Whether the budget holds nbytes_more more (negative: given back); taken if so."""
        if self.budget is not None and self.held + nbytes_more > self.budget:
            return False
        self.held += nbytes_more
        return True

    def track(self):
        """The layer's children but the block that hold tensors, each hooked to be listed as
        it runs (checked at each call: a child may be swapped after pre_quantize), and the
        tails' last linears. Children only: hooks on an MoE block's experts would keep its
        grouped paths off."""
        modules = [m for m in self.layer.children() if m is not self.block
                   and (next(m.parameters(), None) is not None or next(m.buffers(), None) is not None)]
        if tuple(map(id, modules)) != self.tracked:
            self.untrack()
            hook = _Ran(self.outputs)
            self.handles = [m.register_forward_pre_hook(hook) for m in modules]
            self.tracked = tuple(map(id, modules))
        for tail in self.tails.values():
            tail.track()

    def untrack(self):
        for handle in self.handles:
            handle.remove()
        self.handles, self.tracked = [], ()

    def detach(self):
        self.untrack()
        for tail in self.tails.values():
            tail.clear()
        for module, forward in self.forwards.values():
            module.__dict__.pop("forward", None)
            if module.forward != forward:  # an instance forward of its own before ours
                module.forward = forward
        self.records.clear()


def _attached(module):
    """The _Layer `module` is attached to (the layer or a wrapped child), None for a module
    not attached or a copy of one (its forward the class's)."""
    attached = _ATTACHED.get(id(module))
    return attached if attached is not None and attached.forwards[id(module)][0] is module else None


def _layer_forward(layer, *args, **kwargs):
    attached = _attached(layer)
    if attached is None:
        return type(layer).forward(layer, *args, **kwargs)
    return attached.outputs.layer_call(attached, args, kwargs)


def _child_forward(child, *args, **kwargs):
    attached = _attached(child)
    if attached is None:
        return type(child).forward(child, *args, **kwargs)
    return attached.outputs.child_call(attached, child, args, kwargs)


_ATTACHED = {}  # id of an attached layer or wrapped child -> its _Layer


class AttentionOutputs:
    """An installation's attached layers (pre_quantize to post_quantize) and their records."""

    def __init__(self, counters):
        self.counters = counters
        self.attached = {}  # id(layer) -> _Layer
        self.local = threading.local()  # this thread's _LayerCall

    def attach(self, layer, refusal, tails=True):
        """`layer`'s block (and, with tails, the block's and MLP's last-linear inputs) kept
        from now on, unless `refusal` (the loop's, GPTQLoop) says why not."""
        if refusal:
            self.counters.host(PATCH, refusal)
            return
        block = attention_block(layer)
        if block is None:
            self.counters.host(PATCH, "no attention child (%s)" % ", ".join(BLOCK_NAMES))
            return
        if id(layer) in self.attached:
            return
        device = next(itertools.chain(block.parameters(), block.buffers()), torch.empty(0)).device
        budget = torch.cuda.mem_get_info(device)[0] // BUDGET_SHARE if device.type == "cuda" else None
        attached = _Layer(self, layer, block, budget, tails)
        self.attached[id(layer)] = attached
        for key in attached.forwards:
            _ATTACHED[key] = attached

    def detach_all(self):
        for attached in list(self.attached.values()):
            attached.detach()
            for key in attached.forwards:
                _ATTACHED.pop(key, None)
        self.attached.clear()

    def layer_call(self, attached, args, kwargs):
        attached.track()
        previous = getattr(self.local, "current", None)
        self.local.current = _LayerCall(attached, nested_tensors((args, kwargs)))
        try:
            return attached.forward_of(attached.layer)(*args, **kwargs)
        finally:
            self.local.current = previous

    def child_call(self, attached, child, args, kwargs):
        """A wrapped child's run: the block's kept output, a tail's answer, or its own."""
        own = (lambda: attached.forward_of(child)(*args, **kwargs))
        current = getattr(self.local, "current", None)
        if args:
            others = (args[1:], kwargs)
        elif "hidden_states" in kwargs:
            others = ((), {k: v for k, v in kwargs.items() if k != "hidden_states"})
        else:
            others = None
        if torch.is_grad_enabled():
            reason = "autograd on"
        elif current is None or current.layer is not attached:
            reason = "the child called outside its layer's forward"
        elif others is None:
            reason = "no hidden states argument"
        elif not plain(others):
            reason = "an argument other than tensors and plain values (a cache)"
        else:
            reason = None
        if reason:
            if child is attached.block:
                self.counters.host(PATCH, reason)
            return own()
        key, refs = current.next_key(child, others)
        before = signature(current.ran_before(child), recurse=True)
        tail = attached.tails.get(id(child))
        if child is not attached.block:  # the MLP: its tail alone
            return tail.run(key, refs, (before, signature((attached.block,), True), _but_last(child, tail)), own)
        if tail is not None:
            own = (lambda run=own: tail.run(key, refs, (before, _but_last(child, tail)), run))
        return self.block_call(attached, key, refs, (before, signature(tuple(child.modules()), False)), own)

    def block_call(self, attached, key, refs, state, own):
        """The block's output: a copy of its record where `state` (its signature) matches and
        the tensors its key was made from live, else own() (recorded within the budget)."""
        if hooked(attached.block):
            self.counters.host(PATCH, "a hook on the block (its subset's forward)")
            return own()
        record = attached.records.get(key)
        if record is not None and kept_answers(record.signature, record.refs, state):
            self.counters.qlink(PATCH)
            return map_nested(record.output, lambda ts: [t.clone() for t in ts])
        output = own()
        tensors = nested_tensors(output)
        given = nbytes(nested_tensors(record.output)) if record is not None else 0
        if not attached.take(nbytes(tensors) - given):
            self.counters.host(PATCH, "over the layer's budget (a quarter of the GPU's free memory)")
            return output
        attached.records[key] = _Record(map_nested(output, lambda ts: [t.detach().clone() for t in ts]), state, refs)
        self.counters.host(PATCH, "recorded (its inputs or weights new)")
        return output


def _but_last(child, tail):
    """The signature of the child's modules but its tail's last linear."""
    return signature(tuple(child.modules()), False, skip=(tail.on,) if tail.on is not None else ())


class _Record:
    __slots__ = ("output", "signature", "refs")

    def __init__(self, output, signature, refs):
        self.output, self.signature, self.refs = output, signature, refs


def make_pre_quantize(installation, original):
    """BaseQModel.pre_quantize: the layer made ready, then its attention block attached."""
    @like(original)
    def pre_quantize(model, module):
        module = original(model, module)
        installation.attention.attach(module, installation.loop.refusal, installation.tail_inputs)
        return module
    return pre_quantize


def make_post_quantize(installation, original):
    """BaseQModel.post_quantize: every attached layer's records dropped, then the host's."""
    @like(original)
    def post_quantize(model, module):
        installation.attention.detach_all()
        return original(model, module)
    return post_quantize
