"""A decoder layer's attention block's outputs, kept across the layer's forwards.

GPTQModel runs a layer's forward once for each subset it quantizes (stopping after the
subset's last module), then once more whole for the next layer's inputs. Once q/k/v/o are
quantized, each later forward (gate/up's, down's, the replay; an MoE layer's expert stage)
runs the attention block on the same inputs with the same weights, making the same bytes:
on a LLaMA-7B layer two of the block's runs, a quarter of the layer's forward GEMMs. From
the layer's pre_quantize to its post_quantize, a run of the block records a copy of its
output per calibration batch, and a later run returns a copy of the record when nothing it
depends on changed; otherwise the block runs (and its new output is recorded).

Invariant, what "nothing changed" means: the same layer call (every tensor the layer is
given, and every one the block is given but its hidden states, is the same tensor: GPTQModel
replays its cached batches; the block's n-th call in it), the same children of the layer
run before the block, with the same parameters and buffers (the same tensors at the same
address and version), the block's own likewise, no hook on or in the block (a subset being
calibrated), no argument holding state of its own, autograd off. The block's hidden states
are a function of the layer's input and the children that ran before it, so its output is
the record's, bit for bit. A weight written in place keeps its
address: only its version says so, and GPTQModel's loop runs in inference mode, where
tensors keep none. So outputs are kept only inside a loop whose processors are all
GPTQProcessor, which replaces a quantized module's weight tensor (AWQ's and QQQ's write in
place; GPTQLoop). Each layer's records stay within a quarter of its GPU's free memory. Off where the
forwards run on replicas (more than one GPU)."""
import itertools
import threading
import types

import torch

from ...moves import map_nested, nested_tensors
from ..patches import like

PATCH = "attention_outputs"
BLOCK_NAMES = ("self_attn", "attn", "self_attention", "attention")  # the decoder layers' attention child
BUDGET_SHARE = 4  # a layer's records take at most 1/BUDGET_SHARE of its GPU's free memory


def attention_block(layer):
    """The attention child of a decoder layer, or None."""
    children = dict(layer.named_children())
    return next((children[name] for name in BLOCK_NAMES if name in children), None)


def _keys(tensors):
    return tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in tensors)


def _version(t):
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version: its address and identity stand
        return None


def _signature(modules, recurse):
    return tuple((id(m),) + tuple((id(t), t.data_ptr(), _version(t))
                                  for t in itertools.chain(m.parameters(recurse=recurse), m.buffers(recurse=recurse)))
                 for m in modules)


def _plain(value):
    """Whether `value` is tensors and plain values only (nothing that holds state of its
    own, as a key-value cache does)."""
    if isinstance(value, (torch.Tensor, bool, int, float, str, type(None))):
        return True
    if isinstance(value, (tuple, list)):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(map(_plain, value.values()))
    return False


def _hooked(block):
    return any(m._forward_hooks or m._forward_pre_hooks or getattr(m, "forward_hook", None) for m in block.modules())


def _bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


class _Ran:
    """The hook that lists a module as it runs in an attached layer's call; shared by a copy
    of the module (its call is not an attached one)."""

    def __init__(self, outputs):
        self.outputs = outputs

    def __call__(self, module, inputs):
        current = getattr(self.outputs.local, "current", None)
        if current is not None:
            current[2].append(module)

    def __deepcopy__(self, memo):
        return self


class _Record:
    __slots__ = ("output", "signature")

    def __init__(self, output, signature):
        self.output, self.signature = output, signature


class _Layer:
    """One attached layer: its block, the forwards replaced, the records and the hooks that
    list the modules run before the block in each call."""

    def __init__(self, outputs, layer, block, budget):
        self.outputs, self.layer, self.block, self.budget = outputs, layer, block, budget
        self.records, self.held = {}, 0
        self.handles, self.tracked = [], ()
        self.layer_forward, self.block_forward = layer.forward, block.forward
        layer.forward = types.MethodType(_layer_forward, layer)
        block.forward = types.MethodType(_block_forward, block)

    def track(self):
        """The layer's children but the block that hold tensors, each hooked to be listed as
        it runs (checked at each call: a child may be swapped after pre_quantize). Children
        only: hooks on an MoE block's experts would keep its grouped paths off."""
        modules = [m for m in self.layer.children() if m is not self.block
                   and (next(m.parameters(), None) is not None or next(m.buffers(), None) is not None)]
        if tuple(map(id, modules)) != self.tracked:
            self.untrack()
            hook = _Ran(self.outputs)
            self.handles = [m.register_forward_pre_hook(hook) for m in modules]
            self.tracked = tuple(map(id, modules))

    def untrack(self):
        for handle in self.handles:
            handle.remove()
        self.handles, self.tracked = [], ()

    def detach(self):
        self.untrack()
        for module, forward in ((self.layer, self.layer_forward), (self.block, self.block_forward)):
            module.__dict__.pop("forward", None)
            if module.forward != forward:  # an instance forward of its own before ours
                module.forward = forward
        self.records.clear()


def _layer_forward(layer, *args, **kwargs):
    outputs = _OWNERS.get(id(layer))
    attached = outputs.attached.get(id(layer)) if outputs is not None else None
    if attached is None or attached.layer is not layer:  # a copy of an attached layer
        return type(layer).forward(layer, *args, **kwargs)
    return outputs.layer_call(attached, args, kwargs)


def _block_forward(block, *args, **kwargs):
    outputs = _OWNERS.get(id(block))
    attached = outputs.blocks.get(id(block)) if outputs is not None else None
    if attached is None or attached.block is not block:
        return type(block).forward(block, *args, **kwargs)
    return outputs.block_call(attached, args, kwargs)


_OWNERS = {}  # id of an attached layer or block -> its AttentionOutputs


class AttentionOutputs:
    """An installation's attached layers (pre_quantize to post_quantize) and their records."""

    def __init__(self, counters):
        self.counters = counters
        self.attached, self.blocks = {}, {}  # id(layer) / id(block) -> _Layer
        self.local = threading.local()  # this thread's layer call: (_Layer, its key, modules run, [block calls])

    def attach(self, layer, refusal):
        """`layer`'s block kept from now on, unless `refusal` (the loop's, GPTQLoop) says why not."""
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
        attached = _Layer(self, layer, block, budget)
        self.attached[id(layer)], self.blocks[id(block)] = attached, attached
        _OWNERS[id(layer)] = _OWNERS[id(block)] = self

    def detach_all(self):
        for attached in list(self.attached.values()):
            attached.detach()
            for key in (id(attached.layer), id(attached.block)):
                _OWNERS.pop(key, None)
        self.attached.clear()
        self.blocks.clear()

    def layer_call(self, attached, args, kwargs):
        attached.track()
        previous = getattr(self.local, "current", None)
        self.local.current = (attached, _keys(nested_tensors((args, kwargs))), [], [0])
        try:
            return attached.layer_forward(*args, **kwargs)
        finally:
            self.local.current = previous

    def block_call(self, attached, args, kwargs):
        current = getattr(self.local, "current", None)
        if args:
            others = (args[1:], kwargs)
        elif "hidden_states" in kwargs:
            others = ((), {k: v for k, v in kwargs.items() if k != "hidden_states"})
        else:
            others = None
        if torch.is_grad_enabled():
            reason = "autograd on"
        elif current is None or current[0] is not attached:
            reason = "the block called outside its layer's forward"
        elif others is None:
            reason = "no hidden states argument"
        elif not _plain(others):
            reason = "an argument other than tensors and plain values (a cache)"
        else:
            reason = None
        if reason:
            self.counters.host(PATCH, reason)
            return attached.block_forward(*args, **kwargs)
        current[3][0] += 1  # the block's n-th call in this layer call: a layer may call it twice
        key = current[1] + (current[3][0],) + _keys(nested_tensors(others))
        signature = (_signature(tuple(current[2]), recurse=True), _signature(tuple(attached.block.modules()), False))
        if _hooked(attached.block):
            self.counters.host(PATCH, "a hook on the block (its subset's forward)")
            return attached.block_forward(*args, **kwargs)
        record = attached.records.get(key)
        if record is not None and record.signature == signature:
            self.counters.qlink(PATCH)
            return map_nested(record.output, lambda ts: [t.clone() for t in ts])
        output = attached.block_forward(*args, **kwargs)
        tensors = nested_tensors(output)
        held = attached.held - (_bytes(nested_tensors(record.output)) if record is not None else 0)
        if attached.budget is not None and held + _bytes(tensors) > attached.budget:
            self.counters.host(PATCH, "over the layer's budget (a quarter of the GPU's free memory)")
            return output
        attached.records[key] = _Record(map_nested(output, lambda ts: [t.detach().clone() for t in ts]), signature)
        attached.held = held + _bytes(tensors)
        self.counters.host(PATCH, "recorded (its inputs or weights new)")
        return output


def make_pre_quantize(installation, original):
    """BaseQModel.pre_quantize: the layer made ready, then its attention block attached."""
    @like(original)
    def pre_quantize(model, module):
        module = original(model, module)
        installation.attention.attach(module, installation.loop.refusal)
        return module
    return pre_quantize


def make_post_quantize(installation, original):
    """BaseQModel.post_quantize: every attached layer's records dropped, then the host's."""
    @like(original)
    def post_quantize(model, module):
        installation.attention.detach_all()
        return original(model, module)
    return post_quantize
