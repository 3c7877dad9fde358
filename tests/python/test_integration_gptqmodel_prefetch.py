"""The layer_prefetch and module_refill patches against the stand-in GPTQModel's lazy model
fill (tests/python/hosts) on the CPU backend, from safetensors shards: each numbered layer's
fill reads the next layer's tensors on qlink's helper thread and the next fill takes them
(filled the same as by the host's own reads, counted); the fills of a layer's own modules
take copies of its tensors read ahead (the first layer's, not read ahead, a fill to another
device and a fill out of order read for themselves), fresh ones each time, so a fill that
keeps what it is handed changes nothing for the next, dropped when the loop returns or
when a stage owns their modules; a
shard that is not safetensors is read ahead through the host's reader; a failed read-ahead
falls back to the host's read (FallbackRefused under strict, the module untouched);
uninstall gives both bindings back."""
import json
import os
import threading

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel import structure as prefetch
from qlink.integrations.patches import FallbackRefused

from stand_in_hosts import stand_in

LAYERS = 4


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(8, 8, bias=False) for _ in range(2))  # numbered inside


def model():
    torch.manual_seed(0)
    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
    root.model.norm = torch.nn.LayerNorm(8)
    return root


def write_safetensors(path, tensors):
    """The safetensors layout: an 8-byte little-endian header size, a JSON header of each
    tensor's dtype, shape and byte offsets, then the bytes."""
    header, data = {}, b""
    for name, tensor in tensors.items():
        raw = tensor.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little") + encoded + data)


@pytest.fixture
def host(library, tmp_path):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.utils import structure
        weights = {name: p.detach().clone() for name, p in model().named_parameters()}
        shards, weight_map = {}, {}
        for i, (name, tensor) in enumerate(sorted(weights.items())):  # two shards, names interleaved
            shard = "shard-%d.safetensors" % (i % 2)
            shards.setdefault(shard, {})[name] = tensor
            weight_map[name] = shard
        for shard, tensors in shards.items():
            write_safetensors(os.path.join(str(tmp_path), shard), tensors)
        reads = []  # (thread name, checkpoint name) of every read through the host's reader

        class Recorded(structure._Shard):
            def get_tensor(self, name):
                reads.append((threading.current_thread().name, name))
                return super().get_tensor(name)
        structure.safe_open = lambda path, framework="pt", device="cpu": Recorded(path)
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library)
        yield dict(structure=structure, weights=weights, reads=reads, ctx=ctx,
                   turtle=structure.LazyTurtle(str(tmp_path), weight_map))


def empty_shell():
    root = model()
    for module in root.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(torch.empty_like(p, device="meta")))
    return root


def fill(host, root, module):
    return host["turtle"].materialize_submodule(target_model=root, target_submodule=module, device=torch.device("cpu"))


def assert_filled(host, root, index):
    for name, p in root.model.layers[index].named_parameters():
        assert torch.equal(p, host["weights"]["model.layers.%d.%s" % (index, name)])


def host_reads(host, index):
    return [thread for thread, name in host["reads"] if name.startswith("model.layers.%d." % index)]


def test_each_layer_takes_the_tensors_read_ahead_and_its_modules_copies_of_them(host):
    adapter.install(ctx=host["ctx"], strict=True)
    root = empty_shell()
    for index in range(LAYERS):
        layer = root.model.layers[index]
        fill(host, root, layer)
        for linear in (layer.up, layer.experts[1], layer.down):  # filled again before the forwards' replay
            linear.weight.data.zero_()
            fill(host, root, linear)
        assert_filled(host, root, index)
    me = threading.current_thread().name
    assert host_reads(host, 0) == [me] * (6 + 5)  # the first layer's fill read itself, then its modules
    assert all(host_reads(host, index) == [] for index in range(1, LAYERS))
    counts = adapter.counters()["seams"]
    assert counts["layer_prefetch"] == {"qlink": LAYERS - 1, "host": 1, "fallback": 0,
                                        "reasons": {"nothing read ahead": 1}}
    assert counts["module_refill"] == {"qlink": 3 * (LAYERS - 1), "host": 3, "fallback": 0,
                                       "reasons": {"the layer was not read ahead": 3}}


def test_a_module_fill_takes_fresh_copies_and_a_fill_to_another_device_reads_for_itself(host):
    adapter.install(ctx=host["ctx"], strict=True)
    root = empty_shell()
    fill(host, root, root.model.layers[0])
    fill(host, root, root.model.layers[1])
    copies, why = adapter._integration.current.prefetch._kept
    assert why is None
    key = next(k for k in copies._tensors if k[1] == "model.layers.1.up.weight")
    handed = copies.get(key)
    assert torch.equal(handed, host["weights"]["model.layers.1.up.weight"])
    handed.zero_()  # what a fill that registered its tensor as given would do to it later
    assert torch.equal(copies.get(key), host["weights"]["model.layers.1.up.weight"])
    up = root.model.layers[1].up
    up.weight.data.zero_()
    fill(host, root, up)
    assert_filled(host, root, 1)
    assert copies.get(("no shard", "no name")) is None
    host["turtle"].materialize_submodule(target_model=root, target_submodule=up, device=torch.device("meta"))
    assert adapter.counters()["seams"]["module_refill"] == {"qlink": 1, "host": 1, "fallback": 0,
                                                            "reasons": {"a fill to meta, not the layer's cpu": 1}}


def test_the_next_layers_fill_drops_the_layer_befores_copies(host):
    adapter.install(ctx=host["ctx"], strict=True)
    root = empty_shell()
    for index in range(3):
        fill(host, root, root.model.layers[index])
    prefetch_state = adapter._integration.current.prefetch
    names = {name for _, name in prefetch_state._kept[0]._tensors}
    assert names and all(name.startswith("model.layers.2.") for name in names)


def test_copies_a_stage_owns_are_dropped_and_their_fill_reads_for_itself(host):
    adapter.install(ctx=host["ctx"], strict=True)
    root = empty_shell()
    fill(host, root, root.model.layers[0])
    fill(host, root, root.model.layers[1])
    prefetch_state = adapter._integration.current.prefetch
    assert prefetch_state.drop_kept(["experts.1", "experts.7"]) == 1
    names = {name for _, name in prefetch_state._kept[0]._tensors}
    assert "model.layers.1.experts.1.weight" not in names and "model.layers.1.experts.0.weight" in names
    expert = root.model.layers[1].experts[1]
    expert.weight.data.zero_()
    host["reads"].clear()
    fill(host, root, expert)
    assert_filled(host, root, 1)
    assert [name for _, name in host["reads"]] == ["model.layers.1.experts.1.weight"]
    assert prefetch_state.drop_kept([]) == 0


def test_the_last_layers_copies_are_dropped_when_the_loop_returns(host):
    adapter.install(ctx=host["ctx"], strict=True)
    from gptqmodel.looper.module_looper import ModuleLooper
    root = empty_shell()
    prefetch_state = adapter._integration.current.prefetch

    def cache_inputs(calibration_data, **_):  # the loop's body, on the looper itself: the layers filled
        for index in range(2):
            fill(host, root, root.model.layers[index])
        return prefetch_state._kept
    looper = ModuleLooper()
    looper.cache_inputs = cache_inputs
    kept_inside = looper.loop(None)
    assert kept_inside[0] is not None
    assert prefetch_state._kept == (None, "the loop that filled the layer returned")
    fill(host, root, root.model.layers[2])  # read ahead still, after a loop returned
    assert_filled(host, root, 2)
    assert host_reads(host, 2) == []
    assert adapter.counters()["seams"]["layer_prefetch"]["qlink"] == 2


def test_a_fill_out_of_order_or_outside_the_layers_reads_for_itself(host):
    adapter.install(ctx=host["ctx"], strict=True)
    root = empty_shell()
    fill(host, root, root.model.layers[0])
    fill(host, root, root.model.norm)
    fill(host, root, root.model.layers[2])  # layer 1 was read ahead and never asked for
    for index in (0, 2):
        assert_filled(host, root, index)
    assert root.model.layers[1].up.weight.is_meta
    assert host_reads(host, 2) == [threading.current_thread().name] * 6
    assert adapter.counters()["seams"]["layer_prefetch"]["reasons"] == {"nothing read ahead": 2,
                                                                        "not a numbered module": 1}


def test_a_shard_that_is_not_safetensors_is_read_ahead_by_the_hosts_reader(host, monkeypatch):
    monkeypatch.setattr(prefetch, "read_safetensors", lambda path, names, pin: None)
    adapter.install(ctx=host["ctx"], strict=True)
    root = empty_shell()
    fill(host, root, root.model.layers[0])
    fill(host, root, root.model.layers[1])
    assert_filled(host, root, 1)
    assert len(host_reads(host, 1)) == 6 and all(t.startswith("qlink-prefetch") for t in host_reads(host, 1))


@pytest.mark.parametrize("strict", [False, True])
def test_a_failed_read_ahead_falls_back_to_the_hosts_read_or_raises_when_strict(host, strict, monkeypatch):
    def broken(path, names, pin):
        raise OSError("shard unreadable")
    monkeypatch.setattr(prefetch, "read_safetensors", broken)
    adapter.install(ctx=host["ctx"], strict=strict)
    root = empty_shell()
    fill(host, root, root.model.layers[0])
    if strict:
        with pytest.raises(FallbackRefused, match="shard unreadable"):
            fill(host, root, root.model.layers[1])
        assert all(p.is_meta for p in root.model.layers[1].parameters())
        return
    fill(host, root, root.model.layers[1])
    assert_filled(host, root, 1)
    counts = adapter.counters()["seams"]["layer_prefetch"]
    assert counts["fallback"] >= 1 and counts["reasons"]["OSError: shard unreadable"] == counts["fallback"]


def test_read_safetensors_reads_what_the_file_holds(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(4.0)}
    path = os.path.join(str(tmp_path), "x.safetensors")
    write_safetensors(path, tensors)
    out = prefetch.read_safetensors(path, ["b", "a", "missing"], pin=False)
    assert set(out) == {"a", "b"} and all(torch.equal(out[k], tensors[k]) for k in out)
    other = os.path.join(str(tmp_path), "x.pt")
    torch.save(tensors, other)
    assert prefetch.read_safetensors(other, ["a"], pin=False) is None


def test_uninstall_gives_the_fill_and_the_shard_reader_back(host):
    structure = host["structure"]
    originals = structure.safe_open, structure.LazyTurtle.materialize_submodule
    adapter.install(ctx=host["ctx"])
    assert structure.safe_open is not originals[0]
    assert structure.LazyTurtle.materialize_submodule is not originals[1]
    adapter.uninstall()
    assert (structure.safe_open, structure.LazyTurtle.materialize_submodule) == originals


def test_read_ahead_off_leaves_the_fills_alone_and_a_bad_setting_is_named(host):
    structure = host["structure"]
    originals = structure.safe_open, structure.LazyTurtle.materialize_submodule
    adapter.install(ctx=host["ctx"], read_ahead="off")
    assert (structure.safe_open, structure.LazyTurtle.materialize_submodule) == originals
    root = empty_shell()
    fill(host, root, root.model.layers[0])
    fill(host, root, root.model.layers[1])
    assert_filled(host, root, 1)
    assert adapter.counters()["seams"]["layer_prefetch"] == {"qlink": 0, "host": 0, "fallback": 0, "reasons": {}}
    with pytest.raises(ValueError, match="read_ahead must be one of .*'pinned', 'pageable', 'off'.*got 'eager'"):
        adapter.install(ctx=host["ctx"], read_ahead="eager")


def test_pageable_read_ahead_fills_the_same(host):
    adapter.install(ctx=host["ctx"], read_ahead="pageable")
    root = empty_shell()
    fill(host, root, root.model.layers[0])
    fill(host, root, root.model.layers[1])
    assert_filled(host, root, 1)
    assert host_reads(host, 1) == []
    assert adapter.counters()["seams"]["layer_prefetch"]["qlink"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("read_ahead, pinned", [("pinned", True), ("pageable", False)])
def test_on_a_gpu_the_read_ahead_is_page_locked_only_when_pinned(host, library, read_ahead, pinned):
    ctx = qlink.load({"backend": "cuda", "log_level": "off"}, library=library)
    adapter.install(ctx=ctx, strict=True, read_ahead=read_ahead)
    root = empty_shell()
    fill(host, root, root.model.layers[0])
    tensors = adapter._integration.current.prefetch._pending[2].result()
    assert tensors and all(t.is_pinned() == pinned for t in tensors.values())
    host["turtle"].materialize_submodule(target_model=root, target_submodule=root.model.layers[1],
                                         device=torch.device("cuda", 0))
    for name, p in root.model.layers[1].named_parameters():
        assert p.is_cuda and torch.equal(p.cpu(), host["weights"]["model.layers.1." + name])


def test_a_cuda_device_without_index_is_the_current_one(monkeypatch):  # what the refill compares devices by
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert prefetch.resolved_device("cuda") == torch.device("cuda", 1)
    assert prefetch.resolved_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert prefetch.resolved_device("cpu") == torch.device("cpu")


# GPTQModel fills a layer to "cuda" and its modules to "cuda:0": one device.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("layer_device", ["cuda", "cuda:0"])
def test_on_a_gpu_the_modules_fills_copy_the_layers_tensors_on_the_device_from_any_stream(host, library,
                                                                                          layer_device):
    ctx = qlink.load({"backend": "cuda", "log_level": "off"}, library=library)
    adapter.install(ctx=ctx, strict=True)
    root = empty_shell()
    gpu = torch.device("cuda", 0)
    for index in range(2):
        host["turtle"].materialize_submodule(target_model=root, target_submodule=root.model.layers[index],
                                             device=torch.device(layer_device))
    copies, why = adapter._integration.current.prefetch._kept
    assert why is None and all(t.is_cuda for t in copies._tensors.values())
    up = root.model.layers[1].up
    up.weight.data.zero_()
    side = torch.cuda.Stream(gpu)
    with torch.cuda.stream(side):  # ordered after the upload on the default stream by the copies' event
        host["turtle"].materialize_submodule(target_model=root, target_submodule=up, device=gpu)
    side.synchronize()
    for name, p in root.model.layers[1].named_parameters():
        assert p.is_cuda and torch.equal(p.cpu(), host["weights"]["model.layers.1." + name])
    assert host_reads(host, 1) == []
    assert adapter.counters()["seams"]["module_refill"]["qlink"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_a_layer_too_large_for_the_free_memory_is_not_kept(host, library, monkeypatch):
    ctx = qlink.load({"backend": "cuda", "log_level": "off"}, library=library)
    adapter.install(ctx=ctx, strict=True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1024, 1 << 40))
    root = empty_shell()
    gpu = torch.device("cuda", 0)
    for index in range(2):
        host["turtle"].materialize_submodule(target_model=root, target_submodule=root.model.layers[index], device=gpu)
    host["turtle"].materialize_submodule(target_model=root, target_submodule=root.model.layers[1].up, device=gpu)
    assert adapter.counters()["seams"]["module_refill"]["reasons"] == {
        "the layer would take more than 1/4 of the device's free memory": 1}
    assert len(host_reads(host, 1)) == 2  # up's weight and bias, read for themselves
