"""A module's finalize and its offload through qlink (finalize_lookups) on the GPTQModel
stand-in: both find the module down its own path, with no walk of the whole model, and
leave the same quantized linear, packed the same, in the same place, and offload it under
the same name as GPTQModel's walks; a lookup off that path, a walk that would stop above
the module, a module moved since its finalize: the host's walk."""
import types

import pytest
import torch
from torch import nn

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel.contract import finalized_entry

from stand_in_hosts import stand_in

HIDDEN, LAYERS, EXPERTS = 64, 6, 4
FULL_NAME = "layers.4.mlp.experts.2.up_proj"


@pytest.fixture
def host():
    with stand_in("gptqmodel", adapter):
        from gptqmodel.looper import gptq_processor, named_module
        from gptqmodel.quantization import config
        from gptqmodel.utils import offload
        offload.OFFLOADED.clear()
        yield types.SimpleNamespace(gptq_processor=gptq_processor, named_module=named_module, config=config,
                                    offload=offload)


@pytest.fixture
def cpu(library):
    return qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library)


def _model():
    """An MoE-shaped module tree as GPTQModel's BaseQModel holds it (.model)."""
    torch.manual_seed(0)
    root = nn.Module()
    root.embed = nn.Embedding(10, HIDDEN)
    root.layers = nn.ModuleList()
    for _ in range(LAYERS):
        layer = nn.Module()
        layer.mlp = nn.Module()
        layer.mlp.experts = nn.ModuleList()
        for _ in range(EXPERTS):
            expert = nn.Module()
            expert.up_proj, expert.down_proj = nn.Linear(HIDDEN, 32, bias=False), nn.Linear(32, HIDDEN, bias=False)
            layer.mlp.experts.append(expert)
        root.layers.append(layer)
    return types.SimpleNamespace(model=root)


def _solved(host, linear):
    """The stand-in's own solve of the linear: what process() leaves for the finalize."""
    task = host.gptq_processor.GPTQ(linear, host.config.QuantizeConfig())
    task.quantizer.configure(perchannel=True)
    task.add_batch(torch.randn(96, HIDDEN, generator=torch.Generator().manual_seed(1)), None)
    return task.quantize()


def _finalize(host, model, result, monkeypatch):
    """FULL_NAME's finalize and offload: (the module left at its path, how many walks ran)."""
    processor = host.gptq_processor.GPTQProcessor()
    module = host.named_module.NamedModule(model.model.get_submodule(FULL_NAME), "mlp.experts.2.up_proj",
                                           FULL_NAME, 4)
    processor.results[module.name] = result
    walks = []
    for method in ("named_children", "named_modules"):
        original = getattr(nn.Module, method)
        monkeypatch.setattr(nn.Module, method, lambda self, *a, _o=original, **k: walks.append(1) or _o(self, *a, **k))
    processor.submodule_finalize(module, model)
    host.offload.offload_to_disk(module=model.model.get_submodule(FULL_NAME), model=model.model)
    monkeypatch.undo()
    return model.model.get_submodule(FULL_NAME), len(walks)


def test_a_finalize_and_its_offload_go_down_the_modules_own_path(host, cpu, monkeypatch):
    theirs_model, mine_model = _model(), _model()
    result = _solved(host, theirs_model.model.get_submodule(FULL_NAME))
    theirs, their_walks = _finalize(host, theirs_model, result, monkeypatch)
    adapter.install(ctx=cpu)
    mine, my_walks = _finalize(host, mine_model, result, monkeypatch)
    assert their_walks > LAYERS * EXPERTS and my_walks == 0
    assert type(mine) is type(theirs) and mine.name == theirs.name == FULL_NAME
    for key in ("qweight", "qzeros", "scales", "g_idx"):
        assert torch.equal(getattr(mine, key), getattr(theirs, key)), key
    assert host.offload.OFFLOADED == [FULL_NAME, FULL_NAME]
    assert adapter.counters()["seams"]["finalize_lookups"]["qlink"] == 1


def test_lookups_off_the_finalized_path_are_the_hosts(host, cpu):
    from gptqmodel.utils import model as host_model
    model = _model()
    adapter.install(ctx=cpu)
    # Outside a finalize: the processor's walk is the host's.
    assert host.gptq_processor.find_modules(model.model) == host_model.find_modules(model.model)
    # A module no finalize made, and one moved since its finalize: named by the host's walk.
    moved = model.model.get_submodule("layers.1.mlp.experts.0.down_proj")
    assert host.offload.get_module_fullname(model.model, moved) == "layers.1.mlp.experts.0.down_proj"
    processor, result = host.gptq_processor.GPTQProcessor(), _solved(host, model.model.get_submodule(FULL_NAME))
    module = host.named_module.NamedModule(model.model.get_submodule(FULL_NAME), "up", FULL_NAME, 4)
    processor.results["up"] = result
    processor.submodule_finalize(module, model)
    made = model.model.get_submodule(FULL_NAME)
    model.model.layers[5].moved = made
    delattr(model.model.layers[4].mlp.experts[2], "up_proj")
    assert host.offload.get_module_fullname(model.model, made) == "layers.5.moved"


def test_what_the_finalize_reads_of_a_walk_is_its_modules_entry():
    model = _model().model
    linear = model.get_submodule(FULL_NAME)
    assert finalized_entry(model, FULL_NAME, (nn.Linear,)) == {FULL_NAME: linear}
    assert finalized_entry(model, FULL_NAME, (nn.Embedding,)) == {}  # not of the types: no entry
    assert finalized_entry(model, "layers.4.mlp.nowhere", (nn.Linear,)) is None  # the host's walk decides
    assert finalized_entry(model, FULL_NAME, (nn.ModuleList,)) is None  # the walk stops above it
    assert finalized_entry(model, "layers.4", (nn.Module,)) is None  # at the root


def _counted(named_modules, model, walks):
    """named_modules, each walk of the whole model counted (not the walk's inner calls)."""
    def counting(self, *args, **kwargs):
        if self is model and not args and not kwargs:
            walks.append(1)
        return named_modules(self, *args, **kwargs)
    return counting


def test_the_fills_names_come_from_an_index_of_the_model(host, cpu, monkeypatch):
    """_get_qualified_name (the lazy fill's name of a module): the host's name, from one
    walk for every module of the model; a module put in since, and one moved, make one walk
    more; the model itself and a module not in it get the host's walk and error."""
    from gptqmodel.utils import structure
    model, walks = _model().model, []
    adapter.install(ctx=cpu)
    named_modules = nn.Module.named_modules
    monkeypatch.setattr(nn.Module, "named_modules", _counted(named_modules, model, walks))
    for path in ("layers.0.mlp.experts.1.up_proj", "layers.5.mlp", FULL_NAME, "embed"):
        assert structure._get_qualified_name(model, model.get_submodule(path)) == path
    assert len(walks) == 1
    model.layers[3].mlp.experts[0].down_proj = added = nn.Linear(32, HIDDEN, bias=False)
    assert structure._get_qualified_name(model, added) == "layers.3.mlp.experts.0.down_proj"
    moved = model.layers[1].mlp
    del model.layers[1].mlp
    model.layers[2].other = moved
    assert structure._get_qualified_name(model, moved) == "layers.2.other"
    assert len(walks) == 3
    with pytest.raises(ValueError):
        structure._get_qualified_name(model, nn.Linear(1, 1))
    assert adapter.counters()["seams"]["qualified_names"] == {
        "qlink": 6, "host": 1, "fallback": 0, "reasons": {"the model itself or a module not in it": 1}}
