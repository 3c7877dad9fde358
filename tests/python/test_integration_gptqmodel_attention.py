"""The attention outputs kept across a layer's forwards (attention_outputs.py) against the
stand-in GPTQModel on the CPU: a LLaMA-shaped decoder layer driven as GPTQModel's layer
stage drives it (pre_quantize, a forward per subset stopped after the subset's last module
with hooks on the subset, the subset's weights replaced, the replay, post_quantize). Every
hooked input and every output equal, bit for bit, to the same stage without qlink; the
block reused exactly where its inputs and weights stayed; a change before or inside it, a
hook in it, a copy of the layer, all run it again. The o_proj and down_proj inputs kept
(tail_inputs.py) likewise. (Every saving at once, and on transformers' own layer:
test_integration_gptqmodel_stage.py.)"""
import copy
import weakref

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter

from stand_in_hosts import stand_in

HIDDEN, INTER, HEADS, ROWS, BATCHES = 32, 48, 4, 6, 3
SUBSETS = [("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",)]


class Stop(Exception):
    """GPTQModel's StopForward: raised by the subset's last module's hook."""


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, torch.nn.Linear(HIDDEN, HIDDEN, bias=False))

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None):
        b, t, _ = hidden_states.shape
        q, k, v = (getattr(self, n)(hidden_states).view(b, t, HEADS, -1).transpose(1, 2)
                   for n in ("q_proj", "k_proj", "v_proj"))
        q = q * position_embeddings[0] + position_embeddings[1]
        scores = (q @ k.transpose(-1, -2)) / (HIDDEN // HEADS) ** 0.5 + attention_mask
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, HIDDEN)
        return self.o_proj(out), None


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(HIDDEN, INTER, bias=False)
        self.up_proj = torch.nn.Linear(HIDDEN, INTER, bias=False)
        self.down_proj = torch.nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.mlp = Attention(), Mlp()
        self.input_layernorm, self.post_attention_layernorm = torch.nn.LayerNorm(HIDDEN), torch.nn.LayerNorm(HIDDEN)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, use_cache=False):
        h = hidden_states + self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                           position_embeddings=position_embeddings, attention_mask=attention_mask)[0]
        return (h + self.mlp(self.post_attention_layernorm(h)),)


def _batches():
    gen = torch.Generator().manual_seed(1)
    mask = torch.full((ROWS, ROWS), float("-inf")).triu(1)
    return [((torch.randn(1, ROWS, HIDDEN, generator=gen),),
             {"attention_mask": mask, "position_embeddings": (torch.rand(ROWS, HIDDEN // HEADS, generator=gen),
                                                              torch.rand(ROWS, HIDDEN // HEADS, generator=gen))})
            for _ in range(BATCHES)]


def _linear(layer, name):
    return getattr(layer.self_attn if name in SUBSETS[0] + SUBSETS[1] else layer.mlp, name)


def _forward(layer, batches, hooked=(), seen=None, move=None):
    """One of the stage's forwards: every batch (each through move(), where given), the
    hooked modules' inputs into `seen`, stopped after the last of them; the layer's outputs
    where it ran whole."""
    handles, outputs, move = [], [], move() if move is not None else (lambda batch: batch)
    for i, name in enumerate(hooked):
        def hook(module, inputs, output, name=name, last=i == len(hooked) - 1):
            seen.append((name, inputs[0].clone()))
            if last:
                raise Stop()
        handles.append(_linear(layer, name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            for batch in batches:
                args, kwargs = move(batch)
                try:
                    outputs.append(layer(*args, **kwargs)[0])
                except Stop:
                    pass
                del args, kwargs  # a moved batch is freed before the next one moves
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def _quantized(layer, names):
    """The subset's weights replaced (new tensors), as GPTQModel's process() leaves them."""
    for name in names:
        linear = _linear(layer, name)
        linear.weight.data = (linear.weight.data * 64).round() / 64


def _stage(host, layer, batches, between=None, processors=None, move=None):
    """GPTQModel's layer stage over `layer` inside its layer loop (ModuleLooper.loop, in
    inference mode): (every hooked input, the replay's outputs, the layer after post_quantize)."""
    done = []

    def stage(model):
        staged = model.pre_quantize(layer)
        seen = []
        for index, subset in enumerate(SUBSETS):
            _forward(staged, batches, subset, seen, move)
            _quantized(staged, subset)
            if between is not None:
                between(index, staged)
        outputs = _forward(staged, batches, move=move)
        done.append((seen, outputs, model.post_quantize(staged)))

    _in_loop(host, stage, processors)
    return done[0]


def _in_loop(host, stage, processors=None):
    """stage(model) run inside the stand-in ModuleLooper.loop (its capture, under inference
    mode), which hands on an empty calibration cache."""
    model = host["base"].BaseQModel()
    model.quantize_config = type("QuantizeConfig", (), {"device": "cpu"})()

    def capture(calibration_data):
        stage(model)
        return host["input_cache"].InputCache([], [], [], [])

    processors = [host["gptq_processor"].GPTQProcessor()] if processors is None else processors
    host["module_looper"].ModuleLooper(model, capture=capture, processors=processors).loop(None)


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.looper import gptq_processor, input_cache, module_looper
        from gptqmodel.models import base
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library)
        yield dict(base=base, gptq_processor=gptq_processor, input_cache=input_cache, module_looper=module_looper,
                   ctx=ctx)


def _layer():
    torch.manual_seed(0)
    return DecoderLayer()


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, tuple):
            assert x[0] == y[0] and torch.equal(x[1], y[1]), x[0]
        else:
            assert torch.equal(x, y)


def _against_the_host(host, make_layer, between=None, move=None, **install):
    """The stage over make_layer() without qlink, then with qlink installed (install's
    arguments): every hooked input and output the same bytes. Returns qlink's seam counters."""
    batches = _batches()
    torch.manual_seed(0)
    seen, outputs, _ = _stage(host, make_layer(), batches, between, move=move)
    adapter.install(ctx=host["ctx"], strict=True, **install)
    torch.manual_seed(0)
    kept_seen, kept_outputs, _ = _stage(host, make_layer(), batches, between, move=move)
    _same(kept_seen, seen)
    _same(kept_outputs, outputs)
    return adapter.counters()["seams"]


def test_the_block_is_run_once_after_its_quantization_and_the_bytes_stay(host):
    batches = _batches()
    seen, outputs, _ = _stage(host, _layer(), batches)
    adapter.install(ctx=host["ctx"], strict=True)
    hooked = []

    def between(index, layer):  # the children are listed as they run; inside them only the tails' linears
        hooked.append(([name for name, m in layer.named_modules() if m._forward_pre_hooks]))

    kept_seen, kept_outputs, layer = _stage(host, _layer(), batches, between)
    assert hooked == [["self_attn.o_proj", "mlp", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
                      ] * len(SUBSETS)
    _same(kept_seen, seen)
    _same(kept_outputs, outputs)
    counts = adapter.counters()["seams"]["attention_outputs"]
    # gate/up's forward records each batch's block output; down's and the replay reuse it.
    assert counts["qlink"] == 2 * BATCHES
    assert counts["reasons"] == {"a hook on the block (its subset's forward)": 2 * BATCHES,
                                 "recorded (its inputs or weights new)": BATCHES}
    # o_proj's input (from o_proj's forward) answers gate/up's forward but its first batch (the
    # check); down_proj's (from down's forward) the replay's MLP likewise.
    tails = adapter.counters()["seams"]["tail_inputs"]
    assert tails["qlink"] == 2 * (BATCHES - 1)
    assert tails["reasons"] == {"kept (its inputs or weights new)": 2 * BATCHES, "checked against a whole run": 2}
    assert all("forward" not in m.__dict__ for m in (layer, layer.self_attn, layer.mlp))  # detached
    assert not any(m._forward_pre_hooks for m in layer.modules())


CHANGES = {  # made after gate/up's forward; the batches whose block down's forward or the replay reuses
    "a weight before the block replaced": (
        lambda layer: setattr(layer.input_layernorm.weight, "data", layer.input_layernorm.weight.data * 1.5), BATCHES),
    "a weight before the block written in place": (lambda layer: layer.input_layernorm.weight.mul_(1.5), BATCHES),
    "a hook inside the block": (lambda layer: layer.self_attn.k_proj.register_forward_hook(lambda m, i, o: None), 0),
}


class IntoFreedBlocks:
    """GPTQModel's per-batch move where its cache stays in CPU memory: each batch's tensors
    copied into new tensors over the blocks the batch before held, once nothing holds them
    (the caching allocator's reuse, made certain)."""

    def __init__(self):
        self.blocks = {}  # (position in the batch, dtype, numel) -> (block, weak references of its tensors)

    def __call__(self, value, at=None):
        at = [0] if at is None else at
        if isinstance(value, torch.Tensor):
            slot = (at[0], value.dtype, value.numel())
            at[0] += 1
            block, users = self.blocks.get(slot, (None, []))
            if block is None or any(u() is not None for u in users):
                block, users = torch.empty(value.numel(), dtype=value.dtype), []
            moved = block.view(value.shape)
            moved.copy_(value)
            self.blocks[slot] = (block, users + [weakref.ref(moved)])
            return moved
        if isinstance(value, dict):
            return {k: self(v, at) for k, v in value.items()}
        if isinstance(value, (tuple, list)):
            return type(value)(self(v, at) for v in value)
        return value


def test_batches_moved_into_freed_memory_get_their_own_outputs(host):
    """A batch at the addresses a freed batch had is not that batch: no record or kept tail
    input of one answers the other (every record is keyed by addresses, good only while the
    tensors it was made from live)."""
    counters = _against_the_host(host, _layer, move=IntoFreedBlocks)
    assert counters["attention_outputs"]["qlink"] == 0 and counters["tail_inputs"]["qlink"] == 0


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_before_or_inside_the_block_runs_it_again(host, change):
    """After gate/up's forward, one of the block's dependencies changes: down's forward runs
    the block again (recording it afresh, where no hook is in it) and the replay reuses that;
    every byte as the same stage's without qlink."""
    make, reused = CHANGES[change]

    def between(index, layer):
        if index == 2:
            make(layer)

    assert _against_the_host(host, DecoderLayer, between)["attention_outputs"]["qlink"] == reused


class CachedAttention(Attention):
    def forward(self, hidden_states, cache=None, **kwargs):
        return super().forward(hidden_states, **kwargs)


class CachedLayer(DecoderLayer):
    """A layer handing its block an object of its own, as a key-value cache."""

    def __init__(self):
        super().__init__()
        self.self_attn = CachedAttention()

    def forward(self, hidden_states, cache=None, attention_mask=None, position_embeddings=None):
        h = hidden_states + self.self_attn(hidden_states=self.input_layernorm(hidden_states), cache=cache,
                                           position_embeddings=position_embeddings, attention_mask=attention_mask)[0]
        return (h + self.mlp(self.post_attention_layernorm(h)),)


class TwiceLayer(DecoderLayer):
    """A layer calling its block twice, on hidden states a parameter-free step apart."""

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, use_cache=False):
        h = self.input_layernorm(hidden_states)
        for scale in (1.0, 0.5):
            h = h + self.self_attn(hidden_states=h * scale, position_embeddings=position_embeddings,
                                   attention_mask=attention_mask)[0]
        return (h + self.mlp(self.post_attention_layernorm(h)),)


def test_a_block_called_twice_in_a_layer_keeps_each_calls_output(host):
    assert _against_the_host(host, TwiceLayer)["attention_outputs"]["qlink"] == 2 * 2 * BATCHES


def test_a_block_given_a_cache_object_runs_every_time(host):
    """An argument that holds state of its own is no key: the block runs in every forward."""
    cache = object()
    batches = [(args, dict(kwargs, cache=cache)) for args, kwargs in _batches()]
    adapter.install(ctx=host["ctx"], strict=True)
    torch.manual_seed(0)
    _stage(host, CachedLayer(), batches)
    counts = adapter.counters()["seams"]["attention_outputs"]
    assert counts["qlink"] == 0
    assert counts["reasons"] == {"an argument other than tensors and plain values (a cache)": 5 * BATCHES}


def test_outputs_are_kept_only_under_gptqs_processor(host):
    """Another processor may write weights in place, which a tensor in inference mode does
    not show: the layer is not attached, counted with the reason."""
    class AWQProcessor:
        pass

    adapter.install(ctx=host["ctx"], strict=True)
    _stage(host, _layer(), _batches(), processors=[host["gptq_processor"].GPTQProcessor(), AWQProcessor()])
    counts = adapter.counters()["seams"]["attention_outputs"]
    assert counts["qlink"] == 0
    assert counts["reasons"] == {"processors other than GPTQ's (AWQProcessor)": 1}


def test_a_copy_of_an_attached_layer_runs_its_own_block(host):
    """A replica (copy.deepcopy, as a forward worker's clone) computes with its own weights,
    not the original's records."""
    adapter.install(ctx=host["ctx"], strict=True)
    batches = _batches()

    def stage(model):
        layer = model.pre_quantize(_layer())
        first = _forward(layer, batches)  # recorded
        replica = copy.deepcopy(layer)
        replica.self_attn.o_proj.weight.data = replica.self_attn.o_proj.weight.data * 2
        _same(_forward(replica, batches), _forward(_reference(replica), batches))
        _same(_forward(layer, batches), first)  # the original reuses its records
        model.post_quantize(layer)

    _in_loop(host, stage)
    assert adapter.counters()["seams"]["attention_outputs"]["qlink"] == BATCHES


def _reference(layer):
    """A plain DecoderLayer with `layer`'s weights."""
    plain = DecoderLayer()
    plain.load_state_dict(layer.state_dict())
    return plain


def test_off_by_install_and_its_argument_checked(host):
    adapter.install(ctx=host["ctx"], strict=True, attention_outputs=False)
    _stage(host, _layer(), _batches())
    assert adapter.counters()["seams"]["attention_outputs"]["qlink"] == 0
    with pytest.raises(ValueError, match="attention_outputs must be True or False, got 'yes'"):
        adapter.install(ctx=host["ctx"], attention_outputs="yes")


class ScaledMlp(Mlp):
    """An MLP whose output is not its down_proj's output itself."""

    def forward(self, x):
        return super().forward(x) * 1.0


class ScaledLayer(DecoderLayer):
    def __init__(self):
        super().__init__()
        self.mlp = ScaledMlp()


def test_a_child_not_ending_in_its_last_linear_is_not_answered(host):
    """The MLP's output is a new tensor, not down_proj's: the check fails, the MLP runs every
    time (the block's tail still answers), and the bytes stay."""
    tails = _against_the_host(host, ScaledLayer)["tail_inputs"]
    assert tails["qlink"] == BATCHES - 1  # the block's only
    assert tails["reasons"]["the child's output is not its last linear's of the kept input"] == 1


def test_a_change_before_the_last_linear_keeps_the_child_running(host):
    """up_proj's weight replaced after down's forward: the replay's MLP runs whole."""
    def between(index, layer):
        if index == 3:
            layer.mlp.up_proj.weight.data = layer.mlp.up_proj.weight.data * 0.5

    assert _against_the_host(host, DecoderLayer, between)["tail_inputs"]["qlink"] == BATCHES - 1  # the block's


def test_tails_off_by_install(host):
    counts = _against_the_host(host, DecoderLayer, tail_inputs=False)
    assert counts["tail_inputs"]["qlink"] == 0 and counts["attention_outputs"]["qlink"] == 2 * BATCHES
