"""The quantize patch's solve-ahead against the stand-in GPTQModel (tests/python/hosts) on the
CPU backend: a subset's tasks (three reading one input, as q/k/v; two of another shape)
solved in one engine call by the first quantize, in whatever order GPTQModel's workers ask,
spread over the context's devices (four virtual ones; one: not spread), each result
bit-identical to its layer solved alone on the same weight and Hessian; a task whose Hessian
changed after the call, and every task of a batch the engine refuses, solved alone."""
import qlink
import random

import pytest
import torch

from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel import solve
from qlink.quant import GPTQLayer

from test_integration_gptqmodel import host  # noqa: F401 (the fixture)


def subset(host, seed=0, rows=48, group_size=None, layer=None):  # noqa: F811 (the fixture's value)
    """Five tasks fed as one subset's forwards feed them: q/k/v read one input (rows x 256
    weights), two read another (32 x 128). group_size: the QuantizeConfig's (None: its
    default); layer: the tasks named as GPTQModel names that layer's MoE experts."""
    torch.manual_seed(seed)
    options = {} if group_size is None else {"group_size": group_size}
    qcfg = host["config"].QuantizeConfig(damp_percent=0.05, **options)
    tasks = []
    for count, (out_features, in_features) in ((3, (rows, 256)), (2, (32, 128))):
        x = torch.randn(300, 16) @ torch.randn(16, in_features) + 0.1 * torch.randn(300, in_features)
        for _ in range(count):
            g = host["gptq_processor"].GPTQ(torch.nn.Linear(in_features, out_features), qcfg)
            g.quantizer.configure(perchannel=True)
            if layer is not None:
                g.name = "model.layers.%d.mlp.experts.%d.gate_proj" % (layer, len(tasks))
            tasks.append((g, x))
    for g, x in tasks:
        g.add_batch(x, None)
    return [g for g, _ in tasks]


def engine_refusing_above(monkeypatch, most, error):
    """The engine made to raise `error` for a call of more than `most` layers; returns the
    list of every call's layer count."""
    sizes, real = [], solve.parallel_gptq

    def engine(layers, placement, **options):
        sizes.append(len(layers))
        if len(layers) > most:
            raise error
        return real(layers, placement, **options)
    monkeypatch.setattr(solve, "parallel_gptq", engine)
    return sizes


def same(a, b):
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for i, (x, y) in enumerate(zip(a, b)) if i != 4)  # 4: the duration


def test_a_subsets_tasks_are_solved_in_one_call_each_as_alone(host, monkeypatch):  # noqa: F811
    calls, real = [], solve.parallel_gptq

    def recorder(layers, placement, **options):
        calls.append(([(layer.weight.clone(), layer.hessian.clone()) for layer in layers], options, placement.ids))
        return real(layers, placement, **options)
    monkeypatch.setattr(solve, "parallel_gptq", recorder)
    adapter.install(ctx=host["ctx"], strict=True)
    tasks = subset(host)
    order = list(range(5))
    random.Random(1).shuffle(order)
    got = {i: tasks[i].quantize() for i in order}
    assert len(calls) == 1 and len(calls[0][0]) == 5
    assert adapter.counters()["solves"] == {"calls": 1, "layers": 5, "ahead": 4, "refused": 0, "spread": 1}
    assert adapter.counters()["seams"]["quantize"]["qlink"] == 5
    assert not any(hasattr(t, "H") for t in tasks)  # each done with its Hessian at its own call
    # The call's layers: the first asker's, then the rest in the order they were fed. Each
    # solved alone on the same weight and Hessian gives the same result, bit for bit.
    solved = [order[0]] + [i for i in range(5) if i != order[0]]
    layers, options, devices = calls[0]
    assert devices == [0, 1, 2, 3]  # every device of the context, the tasks' own first
    assert all(torch.equal(w, tasks[i].module.weight) for i, (w, _) in zip(solved, layers))
    for index, (weight, hessian) in zip(solved, layers):
        alone = real([GPTQLayer(weight, hessian)], None, **options)[0]
        q, scales, zeros, g_idx, _, loss, damp, nsamples = got[index]
        assert torch.equal(q, alone.weight.to(q.dtype)) and torch.equal(scales, alone.scales)
        assert torch.equal(zeros, alone.zeros) and torch.equal(g_idx, alone.g_idx)
        assert loss == alone.loss / nsamples and damp == alone.damp and nsamples == 300


def test_a_task_fed_after_the_call_is_solved_again_alone(host):  # noqa: F811
    adapter.install(ctx=host["ctx"], strict=True)
    tasks = subset(host)
    tasks[0].quantize()
    tasks[1].add_batch(torch.randn(10, 256), None)  # its Hessian moves on after the call
    tasks[1].quantize()
    assert adapter.counters()["solves"] == {"calls": 2, "layers": 6, "ahead": 0, "refused": 0, "spread": 1}


def test_on_one_device_the_call_is_not_spread(host, library):  # noqa: F811
    adapter.install(ctx=qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library),
                    strict=True)
    one = [t.quantize() for t in subset(host)]
    assert adapter.counters()["solves"] == {"calls": 1, "layers": 5, "ahead": 4, "refused": 0, "spread": 0}
    adapter.install(ctx=host["ctx"], strict=True)
    spread = [t.quantize() for t in subset(host)]
    assert adapter.counters()["solves"]["spread"] == 1
    assert all(same(a, b) for a, b in zip(one, spread))


def test_a_batch_the_engine_refuses_leaves_each_task_to_its_own_solve(host, monkeypatch):  # noqa: F811
    """One refused call of the five, then each solved alone: no sibling tries the rest of the
    batch again (with one Hessian the engine refuses, each would fail)."""
    adapter.install(ctx=host["ctx"], strict=True)
    tasks = subset(host)
    sizes = engine_refusing_above(monkeypatch, 1, ValueError("injected"))
    for t in tasks:
        t.quantize()
    counts = adapter.counters()["solves"]
    assert sizes == [5, 1, 1, 1, 1, 1] and counts["refused"] == 1
    assert counts["ahead"] == 0 and counts["layers"] == 5 and adapter.counters()["seams"]["quantize"]["qlink"] == 5


def test_tasks_of_one_input_take_one_merged_hessian(host, monkeypatch):  # noqa: F811
    """q/k/v (and the other pair) read one input, so they hold one partial: their merges give
    one tensor, which the engine's call gets once for the three (one inverse)."""
    hessians, real = [], solve.parallel_gptq

    def recorder(layers, placement, **options):
        hessians.append([id(layer.hessian) for layer in layers])
        return real(layers, placement, **options)
    monkeypatch.setattr(solve, "parallel_gptq", recorder)
    adapter.install(ctx=host["ctx"], strict=True)
    for t in subset(host):
        t.quantize()
    assert len(hessians) == 1 and len(hessians[0]) == 5 and len(set(hessians[0])) == 2


def test_gptqmodels_own_solve_gets_a_merged_hessian_of_its_own(host, monkeypatch):  # noqa: F811
    """Where the engine fails and GPTQModel's solve runs (it writes its task's Hessian in
    place), each task's solve gets a copy: the next task of the same input still finds the
    merge as it was made."""
    seen = []

    def writing(self, blocksize=128):
        seen.append((id(self.H), bool(self.H.abs().sum() > 0)))
        self.H.zero_()
        return "host"
    monkeypatch.setattr(host["gptq"].GPTQ, "quantize", writing)
    adapter.install(ctx=host["ctx"], strict=False)

    def failing(gptq):
        raise RuntimeError("injected")
    monkeypatch.setattr(adapter._integration.current.ahead, "result_for", failing)
    tasks = subset(host)
    assert [t.quantize() for t in tasks] == ["host"] * 5
    assert all(untouched for _, untouched in seen) and len({i for i, _ in seen}) == 5
    assert adapter.counters()["seams"]["quantize"]["fallback"] == 5


def test_a_call_out_of_memory_halves_the_calls_after_it(host, monkeypatch):  # noqa: F811
    """A call of five tasks that runs out of memory: the asker is solved alone, the others in
    calls of at most two; every result the one its layer gets alone."""
    sizes = engine_refusing_above(monkeypatch, 2,
                                  RuntimeError("cuda: gpuMalloc: cudaErrorMemoryAllocation (out of memory)"))
    adapter.install(ctx=host["ctx"], strict=True)
    got = [t.quantize() for t in subset(host)]
    assert sizes == [5, 1, 2, 2]
    assert adapter.counters()["solves"]["refused"] == 1 and adapter.counters()["solves"]["ahead"] == 2
    monkeypatch.undo()  # the engine as it is
    adapter.install(ctx=host["ctx"], strict=True)
    for t, mine in zip(subset(host), got):
        assert same(t.quantize(), mine)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_small_outputs_come_to_the_cpu_in_one_copy_as_they_were(device):
    # Views of one CPU buffer with each tensor's bytes, shape and dtype; a call's scales, zeros
    # and g_idx on a GPU come to the CPU so, results on the CPU stay as they are.
    tensors = [t.to(device) for t in (torch.randn(48, 2), torch.arange(256, dtype=torch.int32),
                                      torch.randn(3, 5).double(), torch.randn(4, 4).t(),
                                      torch.ones(7, dtype=torch.uint8))]
    moved = solve.to_cpu_at_once(tensors)
    assert [(m.shape, m.dtype, m.device.type) for m in moved] == [(t.shape, t.dtype, "cpu") for t in tensors]
    assert all(torch.equal(m, t.cpu()) for m, t in zip(moved, tensors))
    results = [(torch.zeros(2, 2, device=device), tensors[0], tensors[0].abs(), tensors[1], 0.1, 1.0, 0.01, 300)]
    got = solve.small_outputs_on_cpu(results)
    if device == "cpu":
        assert got is results
    else:
        assert got[0][0] is results[0][0] and got[0][4:] == results[0][4:]
        assert all(g.device.type == "cpu" and torch.equal(g, r.cpu()) for g, r in zip(got[0][1:4], results[0][1:4]))
