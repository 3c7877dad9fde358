"""The layer_prefetch patch against the stand-in GPTQModel's lazy model fill (tests/python/hosts)
on the CPU backend: each numbered layer's fill reads the next layer's checkpoint tensors on
qlink's helper thread, and the next fill takes them (filled the same as the host's own read,
counted); a fill out of order, or of a module with no number, reads for itself; a failed
read-ahead falls back to the host's read (FallbackRefused under strict, the module untouched);
uninstall gives both bindings back."""
import os
import threading

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.patches import FallbackRefused

from stand_in_hosts import stand_in

LAYERS = 4


def model():
    torch.manual_seed(0)
    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8))
                                            for _ in range(LAYERS))
    root.model.norm = torch.nn.LayerNorm(8)
    return root


@pytest.fixture
def host(library, tmp_path):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.utils import structure
        source = model()
        weights = {name: p.detach().clone() for name, p in source.named_parameters()}
        shards, weight_map = {}, {}
        for i, (name, tensor) in enumerate(sorted(weights.items())):  # two shards, names interleaved
            shard = "shard-%d.pt" % (i % 2)
            shards.setdefault(shard, {})[name] = tensor
            weight_map[name] = shard
        for shard, tensors in shards.items():
            torch.save(tensors, os.path.join(str(tmp_path), shard))
        reads = []  # (thread name, checkpoint name) of every read the stand-in served

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


def fill(host, root, index):
    return host["turtle"].materialize_submodule(target_model=root, target_submodule=root.model.layers[index],
                                                device=torch.device("cpu"))


def assert_filled(host, root, index):
    for name, p in root.model.layers[index].named_parameters():
        assert torch.equal(p, host["weights"]["model.layers.%d.%s" % (index, name)])


def read_by(host, index):
    return {thread for thread, name in host["reads"] if name.startswith("model.layers.%d." % index)}


def test_each_layer_fill_takes_the_tensors_read_ahead_during_the_last(host):
    adapter.install(ctx=host["ctx"], strict=True)
    root = empty_shell()
    for index in range(LAYERS):
        fill(host, root, index)
        assert_filled(host, root, index)
    assert read_by(host, 0) == {threading.current_thread().name}
    for index in range(1, LAYERS):
        assert len(read_by(host, index)) == 1 and read_by(host, index).pop().startswith("qlink-prefetch")
    assert len(host["reads"]) == 4 * LAYERS  # each tensor read once
    assert adapter.counters()["layer_prefetch"] == {"qlink": LAYERS - 1, "host": 1, "fallback": 0,
                                                   "reasons": {"nothing read ahead": 1}}


def test_a_fill_out_of_order_or_of_an_unnumbered_module_reads_for_itself(host):
    adapter.install(ctx=host["ctx"], strict=True)
    root = empty_shell()
    fill(host, root, 0)
    host["turtle"].materialize_submodule(target_model=root, target_submodule=root.model.norm, device="cpu")
    fill(host, root, 2)  # layer 1 was read ahead and never asked for
    for index in (0, 2):
        assert_filled(host, root, index)
    assert root.model.layers[1][0].weight.is_meta
    assert read_by(host, 2) == {threading.current_thread().name}
    assert adapter.counters()["layer_prefetch"]["reasons"] == {"nothing read ahead": 2, "not a numbered module": 1}


@pytest.mark.parametrize("strict", [False, True])
def test_a_failed_read_ahead_falls_back_to_the_hosts_read_or_raises_when_strict(host, strict):
    adapter.install(ctx=host["ctx"], strict=strict)
    prefetch = adapter._integration.current.prefetch

    def broken(names):
        raise OSError("shard unreadable")
    prefetch._read = broken
    root = empty_shell()
    fill(host, root, 0)
    if strict:
        with pytest.raises(FallbackRefused, match="shard unreadable"):
            fill(host, root, 1)
        assert all(p.is_meta for p in root.model.layers[1].parameters())
        return
    fill(host, root, 1)
    assert_filled(host, root, 1)
    counts = adapter.counters()["layer_prefetch"]
    assert counts["fallback"] == 1 and counts["reasons"]["OSError: shard unreadable"] == 1


def test_uninstall_gives_the_fill_and_the_shard_reader_back(host):
    structure = host["structure"]
    originals = structure.safe_open, structure.LazyTurtle.materialize_submodule
    adapter.install(ctx=host["ctx"])
    assert structure.safe_open is not originals[0]
    assert structure.LazyTurtle.materialize_submodule is not originals[1]
    adapter.uninstall()
    assert (structure.safe_open, structure.LazyTurtle.materialize_submodule) == originals
