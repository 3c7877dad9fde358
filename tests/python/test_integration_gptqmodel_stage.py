"""A layer's subset forwards as GPTQModel's layer stage runs them (its linears HookedLinear,
each subset's hooks set through the looper's masked wrapper with the last one stopping the
forward, the subset's weights replaced, the hooks cleared, the replay), with all of qlink's
forward savings (the kept attention outputs and tail inputs, the stopped products) against
none of them: every hooked input and every replay output the same bytes. On the stand-ins'
LLaMA-shaped layer and every dense architecture's stand-in layer here, and on transformers'
own LlamaDecoderLayer where transformers is installed (bf16 on the GPU where there is one).
Then the stopped products alone (hooked_linear.py): in a loop with GPTQ's processor alone a
product no one reads is not computed, its hook gets the same input and an output of the
product's shape and dtype, then StopForward as before; a product another hooked module
reads, another processor's loop, a new subset, all compute as GPTQModel does."""
import collections

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter

from stand_in_hosts import stand_in
from test_integration_gptqmodel_attention import DecoderLayer, _batches

SUBSETS = [("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
           ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",))]
NONE = dict(attention_outputs=False, tail_inputs=False, stopped_products=False)


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.looper import gptq_processor, input_cache, module_looper
        from gptqmodel.models import base
        from gptqmodel.nn_modules import hooked_linear
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library)
        yield dict(base=base, gptq_processor=gptq_processor, input_cache=input_cache, module_looper=module_looper,
                   hooked_linear=hooked_linear, ctx=ctx)


def _stage(host, layer, batches, subsets=SUBSETS):
    """(every hooked input, the replay's outputs) of GPTQModel's stage over `layer` and its
    `subsets` ((child, linears): "" for the layer's own), inside the stand-in loop."""
    hooked_linear, seen, outputs = host["hooked_linear"], [], []
    for child, names in subsets:
        for name in names:
            parent = layer.get_submodule(child)
            setattr(parent, name, hooked_linear.HookedLinear.from_linear(getattr(parent, name)))

    def forward(looper):
        for args, kwargs in batches:
            try:
                out = layer(*args, **kwargs)
                outputs.append(out[0] if isinstance(out, tuple) else out)
            except hooked_linear.StopForward:
                pass

    def stage(model, looper):
        staged = model.pre_quantize(layer)
        for child, names in subsets:
            modules = [getattr(staged.get_submodule(child), name) for name in names]
            for i, (name, module) in enumerate(zip(names, modules)):
                def record(m, inputs, output, name=name):
                    seen.append((name, inputs[0].clone()))
                module.forward_hook = looper._masked_hook_wrapper(looper.processors[0], record, name)
                module.forward_hook_last = i == len(modules) - 1
            with torch.no_grad():
                forward(looper)
            for module in modules:  # GPTQModel's process, then the hooks cleared
                module.weight.data = (module.weight.data.float() * 64).round().div(64).to(module.weight.dtype)
                module.forward_hook, module.forward_hook_last = None, False
        with torch.no_grad():
            forward(looper)
        model.post_quantize(staged)

    model = host["base"].BaseQModel()
    model.quantize_config = type("QuantizeConfig", (), {"device": "cpu"})()
    looper = host["module_looper"].ModuleLooper(model, processors=[host["gptq_processor"].GPTQProcessor()])
    looper.capture = lambda calibration_data: (stage(model, looper), host["input_cache"].InputCache([], [], [], []))[1]
    looper.loop(None)
    return seen, outputs


def _against_none(host, make_layer, batches, subsets=SUBSETS):
    """The stage with none of the savings, then with all (install's defaults): the same bytes.
    Returns the seam counters of the second."""
    results = []
    for install in (NONE, {}):
        adapter.install(ctx=host["ctx"], strict=True, **install)
        torch.manual_seed(0)
        results.append(_stage(host, make_layer(), batches, subsets))
    (seen, outputs), (kept_seen, kept_outputs) = results
    assert [n for n, _ in kept_seen] == [n for n, _ in seen]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(kept_seen, seen))
    assert len(kept_outputs) == len(outputs) and all(torch.equal(a, b) for a, b in zip(kept_outputs, outputs))
    return adapter.counters()["seams"]


def test_every_saving_at_once_keeps_the_bytes(host):
    batches = _batches()
    counts = _against_none(host, DecoderLayer, batches)
    n = len(batches)
    assert counts["attention_outputs"]["qlink"] == 2 * n  # down's forward and the replay
    assert counts["tail_inputs"]["qlink"] == 2 * (n - 1)  # gate/up's block, the replay's MLP, after the check
    # The four subsets' last products in every batch; q, k and gate after each subset's first.
    assert counts["stopped_products"]["qlink"] == 4 * n + 3 * (n - 1)


def test_transformers_llama_layer_every_saving_at_once(host):
    transformers = pytest.importorskip("transformers")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                                      num_key_value_heads=2, num_hidden_layers=1, vocab_size=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = model.to(device, torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(3):
        x = torch.randn(2, 64, 256, generator=gen).to(device, torch.bfloat16)
        position_ids = torch.arange(64, device=device)[None].expand(2, -1)
        batches.append(((x,), {"attention_mask": None, "position_ids": position_ids, "use_cache": False,
                               "cache_position": torch.arange(64, device=device),
                               "position_embeddings": model.model.rotary_emb(x, position_ids)}))
    state = model.model.layers[0].state_dict()

    def make_layer():
        layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(config, layer_idx=0)
        layer.load_state_dict(state)
        return layer.to(device, torch.bfloat16)

    counts = _against_none(host, make_layer, batches)
    assert counts["attention_outputs"]["qlink"] == 2 * len(batches), counts["attention_outputs"]
    assert counts["tail_inputs"]["qlink"] == 2 * (len(batches) - 1), counts["tail_inputs"]


OPT_SUBSETS = [("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("out_proj",)), ("", ("fc1",)),
               ("", ("fc2",))]


@pytest.mark.parametrize("arch", ["opt", "llama", "qwen2", "qwen3", "mistral", "gemma2"])
def test_every_architectures_layer_keeps_the_bytes(host, arch):
    """Each dense architecture's stand-in layer (tests/python/hosts/decoder_layers.py: OPT's
    flattened MLP, Qwen2's biases, Qwen3's q/k norms, Gemma2's four norms and softcapping)
    through the stage with every saving against none: the same bytes wherever they engage.
    The attention outputs are kept in every one (its block is the layer's self_attn), the
    stopped products left out in every one (OPT's fc1 and fc2 have no earlier sibling), the
    tail inputs where the MLP is a module of its own (not OPT's, inline in its layer)."""
    import decoder_layers
    cache = decoder_layers.capture(arch, 3)
    batches = []
    for hidden, kwargs, position_ids, mask in zip(*(cache[k] for k in (
            "layer_inputs", "layer_input_kwargs", "position_ids", "attention_masks"))):
        batches.append((tuple(hidden), dict(kwargs, attention_mask=mask, position_ids=position_ids)))
    counts = _against_none(host, lambda: decoder_layers.layers(arch, count=1)[0], batches,
                           OPT_SUBSETS if arch == "opt" else SUBSETS)
    n = len(batches)
    assert counts["attention_outputs"]["qlink"] == 2 * n, counts["attention_outputs"]
    earlier = 2 if arch == "opt" else 3  # q and k before v; gate before up
    assert counts["stopped_products"]["qlink"] == 4 * n + earlier * (n - 1), counts["stopped_products"]
    assert counts["tail_inputs"]["qlink"] == (0 if arch == "opt" else 2 * (n - 1)), counts["tail_inputs"]


HIDDEN, OUT, BATCHES = 16, 24, 3
NAMES = ("q_proj", "k_proj", "v_proj")


class Qkv(torch.nn.Module):
    def __init__(self, hooked):
        super().__init__()
        torch.manual_seed(0)
        for name in NAMES:
            setattr(self, name, hooked.HookedLinear.from_linear(torch.nn.Linear(HIDDEN, OUT, bias=False)))

    def forward(self, x):
        return self.q_proj(x) + self.k_proj(x) + self.v_proj(x)


@pytest.fixture
def products(monkeypatch):
    """The products torch.nn.Linear computes, per module."""
    made, forward = collections.Counter(), torch.nn.Linear.forward

    def counting(module, input):
        made[module.module_name] += 1
        return forward(module, input)
    monkeypatch.setattr(torch.nn.Linear, "forward", counting)
    return made


def _subset(host, processors=None, hooked=NAMES, block=Qkv):
    """The subset forward of `hooked` (the last one stopping it) over every batch, inside the
    stand-in layer loop: what each hook saw, (input, output shape, output dtype)."""
    seen = []
    hooked_linear = host["hooked_linear"]

    def stage(looper):
        layer = block(hooked_linear)
        for name in NAMES:
            getattr(layer, name).module_name = name
        for i, name in enumerate(hooked):
            def hook(module, inputs, output, name=name):
                seen.append((name, inputs[0].clone(), tuple(output.shape), output.dtype))
            module = getattr(layer, name)
            module.forward_hook = looper._masked_hook_wrapper(looper.processors[0], hook, name)
            module.forward_hook_last = i == len(hooked) - 1
        gen = torch.Generator().manual_seed(1)
        for _ in range(BATCHES):
            with pytest.raises(hooked_linear.StopForward):
                layer(torch.randn(2, 5, HIDDEN, generator=gen).bfloat16().float())

    model = host["base"].BaseQModel()
    model.quantize_config = type("QuantizeConfig", (), {"device": "cpu"})()
    looper = None

    def capture(calibration_data):
        stage(looper)
        return host["input_cache"].InputCache([], [], [], [])

    processors = [host["gptq_processor"].GPTQProcessor()] if processors is None else processors
    looper = host["module_looper"].ModuleLooper(model, capture=capture, processors=processors)
    looper.loop(None)
    return seen


def _same(a, b):
    assert [(n, s, d) for n, _, s, d in a] == [(n, s, d) for n, _, s, d in b]
    assert all(torch.equal(x, y) for (_, x, _, _), (_, y, _, _) in zip(a, b))


def test_products_no_one_reads_are_not_computed_and_the_hooks_see_the_same(host, products):
    """v_proj's (the last) in every batch; q_proj's and k_proj's, given v_proj's input, after
    the first batch showed that."""
    own = _subset(host)
    assert products == {name: BATCHES for name in NAMES}
    products.clear()
    adapter.install(ctx=host["ctx"], strict=True)
    mine = _subset(host)
    _same(mine, own)
    assert products == {"q_proj": 1, "k_proj": 1}
    assert adapter.counters()["seams"]["stopped_products"] == {"qlink": 3 * BATCHES - 2, "host": 0, "fallback": 0,
                                                               "reasons": {}}


class Chain(torch.nn.Module):
    """A subset whose second module reads the first one's output."""

    def __init__(self, hooked):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj = hooked.HookedLinear.from_linear(torch.nn.Linear(HIDDEN, HIDDEN, bias=False))
        self.k_proj = hooked.HookedLinear.from_linear(torch.nn.Linear(HIDDEN, OUT, bias=False))
        self.v_proj = hooked.HookedLinear.from_linear(torch.nn.Linear(HIDDEN, OUT, bias=False))

    def forward(self, x):
        return self.k_proj(torch.relu(self.q_proj(x))) + self.v_proj(x)


def test_a_product_another_hooked_module_reads_is_computed(host, products):
    """q_proj's output is k_proj's input: every batch computes q_proj and k_proj (only v_proj's,
    the last, is left out), and k_proj's hook sees what it sees without qlink."""
    own = _subset(host, block=Chain)
    products.clear()
    adapter.install(ctx=host["ctx"], strict=True)
    _same(_subset(host, block=Chain), own)
    assert products == {"q_proj": BATCHES, "k_proj": BATCHES}


class ReusedChain(Chain):
    """Chain with the second module's input written where the first one's input was freed,
    and the last module's a new tensor there too (the caching allocator's reuse, made
    certain): every input at one address, no two the same tensor."""

    def __init__(self, hooked):
        super().__init__(hooked)
        self.block = None

    def _at_block(self, value):
        if self.block is None:
            self.block = torch.empty(value.numel())
        return self.block.view(value.shape).copy_(value)

    def forward(self, x):
        q = self.q_proj(self._at_block(x))
        k = self.k_proj(self._at_block(torch.relu(q)))
        return k + self.v_proj(self._at_block(torch.relu(q)))


def test_inputs_at_one_address_are_not_one_input(host, products):
    """q_proj's output feeds k_proj and v_proj through memory q_proj's input was freed from:
    the products are computed in every batch (the hooks see what they see without qlink)."""
    own = _subset(host, block=ReusedChain)
    products.clear()
    adapter.install(ctx=host["ctx"], strict=True)
    _same(_subset(host, block=ReusedChain), own)
    assert products == {"q_proj": BATCHES, "k_proj": BATCHES}


def test_another_processor_keeps_every_product(host, products):
    class AWQProcessor:
        pass

    adapter.install(ctx=host["ctx"], strict=True)
    _subset(host, processors=[host["gptq_processor"].GPTQProcessor(), AWQProcessor()])
    assert products == {name: BATCHES for name in NAMES}
    counts = adapter.counters()["seams"]["stopped_products"]
    assert counts["qlink"] == 0 and counts["reasons"] == {"processors other than GPTQ's (AWQProcessor)": 3 * BATCHES}


def test_a_hook_no_weak_reference_holds_keeps_its_module_computing(host, products, monkeypatch):
    """A hook object that cannot be weakly referenced is never marked: its module computes in
    every batch, the last one's product still left out."""
    wrapper = host["module_looper"].ModuleLooper._masked_hook_wrapper
    monkeypatch.setattr(host["module_looper"].ModuleLooper, "_masked_hook_wrapper",
                        lambda self, processor, inner_hook, hook_source: _Unreferenceable(
                            wrapper(self, processor, inner_hook, hook_source)))
    adapter.install(ctx=host["ctx"], strict=True)
    _subset(host)
    assert products == {"q_proj": BATCHES, "k_proj": BATCHES}


class _Unreferenceable:
    """A callable hook without __weakref__ (slots only)."""
    __slots__ = ("hook",)

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, *args):
        return self.hook(*args)


def test_a_new_subset_starts_computing_again(host, products):
    """Each subset's hooks are new objects: what an earlier subset showed does not carry over."""
    adapter.install(ctx=host["ctx"], strict=True)
    _subset(host, hooked=("q_proj", "k_proj"))
    _subset(host, hooked=("q_proj", "k_proj"))
    assert products == {"q_proj": 2}  # each subset's first batch; k_proj (last) never; v_proj never runs


def test_off_by_install(host, products):
    adapter.install(ctx=host["ctx"], strict=True, stopped_products=False)
    _subset(host)
    assert products == {name: BATCHES for name in NAMES}
    with pytest.raises(ValueError, match="stopped_products must be True or False, got 0"):
        adapter.install(ctx=host["ctx"], stopped_products=0)
