"""A stopped subset's last hooked linear (hooked_linear.py) against the stand-in GPTQModel
on the CPU: in a loop with GPTQ's processor alone its product is not computed, its hook gets
the same input and an output of the product's shape and dtype, then StopForward as before;
every other call (an earlier module of the subset, an unhooked one, a loop with another
processor) computes as GPTQModel does."""
import collections

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter

from stand_in_hosts import stand_in

HIDDEN, OUT, BATCHES = 16, 24, 3
NAMES = ("q_proj", "k_proj", "v_proj")


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.looper import gptq_processor, input_cache, module_looper
        from gptqmodel.models import base
        from gptqmodel.nn_modules import hooked_linear
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library)
        yield dict(base=base, gptq_processor=gptq_processor, input_cache=input_cache, module_looper=module_looper,
                   hooked_linear=hooked_linear, ctx=ctx)


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


def test_another_processor_keeps_every_product(host, products):
    class AWQProcessor:
        pass

    adapter.install(ctx=host["ctx"], strict=True)
    _subset(host, processors=[host["gptq_processor"].GPTQProcessor(), AWQProcessor()])
    assert products == {name: BATCHES for name in NAMES}
    counts = adapter.counters()["seams"]["stopped_products"]
    assert counts["qlink"] == 0 and counts["reasons"] == {"processors other than GPTQ's (AWQProcessor)": 3 * BATCHES}


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
