"""AutoRound's unwraps of same-shaped layers stacked (grouped_unwrap) on the AutoRound
stand-in, CPU backend, the CPU standing in for a GPU (on a real CPU device the stacking is
slower and refused): iters=0 on one device (RTN and optimized RTN of an MoE block, whose
routed experts AutoRound quantizes by plain RTN) equal to AutoRound's layer-by-layer RTN in
every weight and every attribute the unwrap writes; the layers the stacking refuses, each
reason named; a stacked unwrap that sets something unknown writes nothing."""
import types

import pytest
import torch

from qlink.integrations import autoround as adapter
from qlink.integrations.autoround import grouped_unwrap

from test_integration_autoround import cpu, host, scheme  # noqa: F401 (host: the stand-in's fixture)
from test_integration_autoround_experts import EXPERTS, MoeBlock, assert_equal_unwraps


@pytest.fixture(autouse=True)
def stacking_on_the_cpu(monkeypatch):
    """The CPU stands in for a GPU, where stacking pays."""
    monkeypatch.setattr(grouped_unwrap, "worth_stacking", lambda device: True)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = MoeBlock()
        self.block.attn = torch.nn.Linear(64, 64)
        scheme(self.block.attn, "block.attn")
        for name, m in self.block.named_modules():
            if getattr(m, "bits", 16) <= 8:
                m.global_name = "block." + name


def _rtn(host, cls, moe=True, layers=None, seed=0, device="cpu", dtype=torch.float32):  # noqa: F811
    """The block's iters=0 quantization by `cls` on `device` in `dtype`, with the imatrix
    AutoRound's forward hooks leave on each layer."""
    torch.manual_seed(seed)
    model = Model().to(device, dtype)
    for name, options in (layers or {}).items():
        for key, value in options.items():
            setattr(model.block.get_submodule(name), key, value)
    for m in model.modules():
        if getattr(m, "bits", 16) <= 8:
            m.imatrix, m.imatrix_cnt = torch.rand(m.in_features, device=device) * 4, 2
    q = cls(None)
    q.model, q.model_context.is_moe_model = model, moe
    q.quantize_block(model.block, None, {}, None, None, types.SimpleNamespace(block_name="block"))
    return model


def _assert_equal(a, b):
    for (name, x), y in zip(a.block.named_parameters(), b.block.parameters()):
        assert torch.equal(x, y), name
    assert_equal_unwraps(a.block, b.block)


@pytest.mark.parametrize("name", ["RTNQuantizer", "OptimizedRTNQuantizer"])
def test_iters_0_on_one_device_unwraps_each_projections_experts_in_one_call(host, library, name):  # noqa: F811
    own = _rtn(host, getattr(host.rtn, name))
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    mine = _rtn(host, getattr(host.rtn, name))
    _assert_equal(own, mine)
    counters = adapter.counters()["seams"]
    assert counters["rtn_layers"]["reasons"] == {"only 1 device visible: serial": 1}
    assert counters["grouped_unwrap"]["qlink"] == 2  # the ups, the downs
    # Optimized RTN searches each layer's scales on its own imatrix; AutoRound turns it off for an
    # MoE model's routed experts, which are stacked then.
    assert counters["grouped_unwrap"]["reasons"] == ({"no other layer of its shape and options": 1}
                                                     if name == "RTNQuantizer" else
                                                     {"optimized RTN (a scale search a layer)": 1})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_stacked_rtn_equals_autorounds_bit_for_bit(host, ctx, monkeypatch):  # noqa: F811
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(host.auto_round.utils.device_manager.device_manager, "device", gpu)
    for dtype in (torch.float32, torch.bfloat16):
        adapter.uninstall()
        own = _rtn(host, host.rtn.RTNQuantizer, device=gpu, dtype=dtype)
        adapter.install("auto", ctx=ctx, strict=True)
        mine = _rtn(host, host.rtn.RTNQuantizer, device=gpu, dtype=dtype)
        _assert_equal(own, mine)
        assert adapter.counters()["seams"]["grouped_unwrap"]["qlink"] == 2


def test_optimized_rtn_of_a_dense_models_layers_is_never_stacked(host, library):  # noqa: F811
    own = _rtn(host, host.rtn.OptimizedRTNQuantizer, moe=False)
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    mine = _rtn(host, host.rtn.OptimizedRTNQuantizer, moe=False)
    _assert_equal(own, mine)
    counters = adapter.counters()["seams"]["grouped_unwrap"]
    assert counters["qlink"] == 0 and counters["reasons"] == {"optimized RTN (a scale search a layer)": 2 * EXPERTS + 1}


def test_layers_the_stacking_does_not_cover_are_unwrapped_alone_each_reason_named(host, library):  # noqa: F811
    layers = {"experts.0.up": {"act_bits": 8}, "experts.1.up": {"act_max": torch.ones(1)},
              "experts.2.up": {"data_type": "mx_fp"}, "experts.3.down": {"group_size": 16}}
    own = _rtn(host, host.rtn.RTNQuantizer, layers=layers)
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    mine = _rtn(host, host.rtn.RTNQuantizer, layers=layers)
    _assert_equal(own, mine)
    counters = adapter.counters()["seams"]["grouped_unwrap"]
    assert counters["qlink"] == 1  # the downs of experts 0 to 2
    assert counters["reasons"] == {
        "activation quantization (act_bits 8)": 1, "its attribute 'act_max' is a Tensor": 1,
        "data_type 'mx_fp'": 1, "no other layer of its shape and options": 3}  # experts.3's up and down, attn


def test_a_stacked_unwrap_that_sets_more_writes_nothing(host, library, monkeypatch):  # noqa: F811
    """An unwrap that sets an attribute stacking cannot split is refused before any layer is
    written; without strict the group goes layer by layer (AutoRound's), counted."""
    from auto_round import wrapper
    unwrapper = wrapper.WrapperLinear.unwrapper

    def more(self, best_params):
        out = unwrapper(self, best_params)
        out.act_scale = torch.ones(1)
        return out
    monkeypatch.setattr(wrapper.WrapperLinear, "unwrapper", more)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 32, bias=False) for _ in range(3)]
    for i, layer in enumerate(layers):
        scheme(layer, "l%d" % i)
    before = [layer.weight.detach().clone() for layer in layers]
    with pytest.raises(grouped_unwrap.UngroupedLayers, match=r"the unwrap set \['act_scale'\]"):
        grouped_unwrap.unwrap(wrapper.WrapperLinear, layers, [None] * 3, device="cpu", iters=0)
    assert all(torch.equal(layer.weight, w) and not hasattr(layer, "scale") for layer, w in zip(layers, before))

    own = _rtn(host, host.rtn.RTNQuantizer)
    adapter.install("auto", ctx=cpu(library, 1))
    mine = _rtn(host, host.rtn.RTNQuantizer)
    _assert_equal(own, mine)
    counters = adapter.counters()["seams"]["grouped_unwrap"]
    assert counters["fallback"] == 2 and counters["qlink"] == 0
    assert counters["reasons"] == {"UngroupedLayers: the unwrap set ['act_scale']": 2,
                                   "no other layer of its shape and options": 1}


def test_groups_bound_a_calls_elements_in_calls_of_near_equal_size_and_keep_the_order(monkeypatch):
    monkeypatch.setattr(grouped_unwrap, "MAX_ELEMENTS", 3 * 32 * 64)
    layers = []
    for i in range(7):
        layer = torch.nn.Linear(64, 32, bias=False)
        scheme(layer, "l%d" % i)
        layers.append(("l%d" % i, layer, torch.device("cpu")))
    stacked, alone = grouped_unwrap.groups(layers)
    assert [[n for n, _ in g] for g in stacked] == [["l0", "l1", "l2"], ["l3", "l4"], ["l5", "l6"]] and alone == {}
    stacked, alone = grouped_unwrap.groups(layers[:1] + [("meta", torch.nn.Linear(64, 32, device="meta"),
                                                          torch.device("cpu"))])
    assert stacked == [] and alone == {"l0": "no other layer of its shape and options", "meta": "weights not on cpu"}


def test_on_a_real_cpu_device_the_layers_go_one_by_one(host, library, monkeypatch):  # noqa: F811
    monkeypatch.undo()
    own = _rtn(host, host.rtn.RTNQuantizer)
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    mine = _rtn(host, host.rtn.RTNQuantizer)
    _assert_equal(own, mine)
    counters = adapter.counters()["seams"]["grouped_unwrap"]
    assert counters["qlink"] == 0
    assert counters["reasons"] == {"on the CPU (one by one is faster there)": 2 * EXPERTS + 1}
