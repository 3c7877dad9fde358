"""The pack-ahead against the stand-in GPTQModel (tests/python/hosts) on the CPU backend: a
subset's layers solved in one engine call have their words made with it, and each
finalizer's pack_block registers the very buffers it registers without qlink's words
(counted "taken"); a layer whose inputs are not the solve's is packed as before ("missed"),
words no finalizer takes within three layers are dropped."""
import pytest
import torch

from qlink.integrations import gptqmodel as adapter

from test_integration_gptqmodel import host  # noqa: F401 (the fixture)
from test_integration_gptqmodel_solve_ahead import subset as solve_ahead_subset


@pytest.fixture
def qlinear(host):  # noqa: F811 (the fixture's value)
    from gptqmodel.nn_modules import qlinear
    return qlinear


def subset(host, layer=0, seed=0):  # noqa: F811 (the fixture's value)
    """The solve-ahead tests' five tasks in shapes the packed layout holds (64 x 256 and
    32 x 128, groups of 32), named as GPTQModel names an MoE layer's experts."""
    return solve_ahead_subset(host, seed=seed, rows=64, group_size=32, layer=layer)


def finalized(qlinear, task, result, scales=None):
    """The buffers a finalizer's pack_block registers for `task`'s solved layer."""
    q, solved_scales, zeros, g_idx = result[:4]
    linear = torch.nn.Linear(q.shape[1], q.shape[0], bias=False)
    linear.weight.data = q.clone()
    module = qlinear.PackableQuantLinear(4, q.shape[1], q.shape[0], name=task.name)
    module.pack_block(linear, solved_scales if scales is None else scales, zeros, g_idx)
    return {name: buffer.clone() for name, buffer in module.named_buffers()}


def same(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_a_solve_calls_layers_take_words_equal_to_their_own_pack(host, qlinear):  # noqa: F811
    adapter.install(ctx=host["ctx"], strict=True)
    tasks = subset(host)
    results = [t.quantize() for t in tasks]
    assert adapter.counters()["packs"]["made"] == 5
    ahead = [finalized(qlinear, t, r) for t, r in zip(tasks, results)]
    assert adapter.counters()["packs"] == {"made": 5, "taken": 5, "missed": 0, "dropped": 0, "refused": 0}
    alone = [finalized(qlinear, t, r) for t, r in zip(tasks, results)]  # nothing left ahead: packed again
    assert all(same(a, b) for a, b in zip(ahead, alone))
    assert adapter.counters()["seams"]["pack"]["qlink"] == 10


def test_a_layer_whose_inputs_are_not_the_solves_is_packed_as_before(host, qlinear):  # noqa: F811
    adapter.install(ctx=host["ctx"], strict=True)
    tasks = subset(host)
    results = [t.quantize() for t in tasks]
    scales = results[1][1].clone()
    scales[0, 0] *= 2
    got = finalized(qlinear, tasks[1], results[1], scales)
    assert adapter.counters()["packs"]["missed"] == 1
    adapter.uninstall()
    assert same(got, finalized(qlinear, tasks[1], results[1], scales))  # the stand-in's own packer's


def test_words_no_finalizer_took_within_three_layers_are_dropped(host):  # noqa: F811
    adapter.install(ctx=host["ctx"], strict=True)
    for layer in range(4):
        for t in subset(host, layer, seed=layer):
            t.quantize()
    assert adapter.counters()["packs"] == {"made": 20, "taken": 0, "missed": 0, "dropped": 5, "refused": 0}
