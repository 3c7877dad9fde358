"""qlink.quant.HessianAccumulator on the CPU backend: partials of calibration hooks through
hessian_accumulate, modules reading one input sharing one accumulation (equal to each
accumulating its own), sharing never crossing different inputs or different histories,
refusals and failures leaving the caller's partial as it was, the precision argument;
add_into's in-place partials equal add_many's."""
import os

import pytest
import torch

import qlink
from qlink import errors
from qlink.quant import HessianAccumulator


@pytest.fixture
def cpu(library):
    with qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library) as ctx:
        yield ctx


def activations(batches, rows, cols, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batches):
        x = torch.randn(1, rows, cols, generator=g)
        x[..., 3] *= 30  # an outlier channel, as decoder inputs have
        out.append(x.to(dtype))
    return out


def reference(xs):
    """sum_b X_b^T X_b in float64."""
    h = 0
    for x in xs:
        x = x.reshape(-1, x.shape[-1]).double()
        h = h + x.T @ x
    return h


def test_a_grouped_input_added_in_blocks_sums_as_its_samples_added_one_by_one(cpu):
    """Eight samples in one input, blocks=8: bit-identical to eight adds (a host adding one
    sample at a time); blocks=1 sums the same rows in another blocking (equal to rounding)."""
    samples = activations(8, 64, 40, seed=3)
    one_by_one = None
    alone = HessianAccumulator(cpu)
    for x in samples:
        one_by_one = alone.add(x, one_by_one)
    grouped = torch.cat(samples)
    acc = HessianAccumulator(cpu)
    assert torch.equal(acc.add(grouped, None, blocks=8), one_by_one)
    assert acc.counters() == {"accumulations": 1, "shared": 0, "rows": 8 * 64, "calls": 1}
    torch.testing.assert_close(acc.add(grouped.clone(), None), one_by_one, rtol=1e-5, atol=1e-2)


def test_shared_accumulation_equals_each_module_accumulating_its_own(cpu):
    """q/k/v read one input and o another, per batch, as GPTQModel's hooks see them: q/k/v end
    holding one tensor, computed once per batch, bit-identical to a module given its own copy."""
    attn, out = activations(3, 40, 24, seed=1), activations(3, 40, 24, seed=2)
    acc, alone = HessianAccumulator(cpu), HessianAccumulator(cpu)
    held = {name: None for name in ("q", "k", "v", "o")}
    own = dict(held)
    for x, y in zip(attn, out):
        views = {"q": x, "k": x.data.reshape(-1, 24), "v": x.data.view(1, -1, 24)}  # views of one input
        for name in ("q", "k", "v"):
            held[name] = acc.add(views[name], held[name])
            own[name] = alone.add(x.clone(), own[name])                # a copy: nothing to share
        held["o"] = acc.add(y, held["o"])
        own["o"] = alone.add(y.clone(), own["o"])
    assert held["q"] is held["k"] is held["v"] and held["o"] is not held["q"]
    for name in held:
        assert torch.equal(held[name], own[name]), name
    assert torch.allclose(held["q"].double(), reference(attn), rtol=1e-5, atol=1e-3)
    assert torch.allclose(held["o"].double(), reference(out), rtol=1e-5, atol=1e-3)
    assert acc.counters() == {"accumulations": 6, "shared": 6, "rows": 6 * 40, "calls": 6}
    assert alone.counters() == {"accumulations": 12, "shared": 0, "rows": 12 * 40, "calls": 12}


def test_a_module_whose_input_differs_gets_its_own_partial(cpu):
    (x0, x1), (z1,) = activations(2, 16, 8, seed=3), activations(1, 16, 8, seed=4)
    acc = HessianAccumulator(cpu)
    q = k = None
    q, k = acc.add(x0, q), acc.add(x0, k)
    assert q is k
    q, k = acc.add(x1, q), acc.add(z1, k)  # k read something else this batch
    assert q is not k
    assert torch.allclose(q.double(), reference([x0, x1]), rtol=1e-5, atol=1e-3)
    assert torch.allclose(k.double(), reference([x0, z1]), rtol=1e-5, atol=1e-3)
    # Partials that differ stay apart even when they read one input next.
    (x2,) = activations(1, 16, 8, seed=5)
    q2, k2 = acc.add(x2, q), acc.add(x2, k)
    assert q2 is not k2 and not torch.equal(q2, k2)
    assert acc.counters()["shared"] == 1


def test_sharing_never_outlives_the_input(cpu):
    """An input's memory taken by another tensor after it is gone is not the same input: the
    accumulator holds each input it may still match, so its address cannot come back."""
    acc = HessianAccumulator(cpu)
    x = activations(1, 8, 4, seed=6)[0].reshape(-1, 4)
    first = acc.add(x, None)
    address = x.data_ptr()
    del x
    y = torch.empty(8, 4, dtype=torch.bfloat16)
    assert y.data_ptr() != address
    y.copy_(activations(1, 8, 4, seed=7)[0].reshape(-1, 4))
    second = acc.add(y, None)
    assert second is not first and acc.counters()["accumulations"] == 2


def test_leading_dims_rows_and_dtypes(cpu):
    acc = HessianAccumulator(cpu)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = activations(1, 12, 8, dtype=dtype, seed=8)[0].reshape(2, 2, 3, 8)
        h = acc.add(x, None)
        assert h.dtype == torch.float32 and h.shape == (8, 8)
        assert torch.allclose(h.double(), reference([x]), rtol=1e-5, atol=1e-2), dtype
        assert torch.equal(h, h.T)
    partial = torch.ones(8, 8)
    assert acc.add(torch.empty(0, 8), partial) is partial  # no rows: nothing to add


def _routed(tokens, experts, top_k, gen):
    """Each expert's rows of `tokens` under a random top-k routing (an MoE router's
    assignment), in token order; an expert no token chose gets no rows."""
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens.shape[0])])
    chosen[chosen == experts - 1] = 0  # the last expert receives nothing
    return [tokens[(chosen == e).any(dim=1)] for e in range(experts)]


def test_an_moe_layers_experts_in_one_call_each_equal_their_rows_alone(cpu):
    """Two forwards of an MoE layer: every expert's gate and up read its routed rows, all
    experts' partials made by one native call per forward (gate and up sharing one), each
    bit-identical to the expert's rows accumulated alone; the expert without rows keeps
    its partial (None)."""
    experts, gen = 6, torch.Generator().manual_seed(11)
    acc, alone = HessianAccumulator(cpu), HessianAccumulator(cpu)
    held = {(e, name): None for e in range(experts) for name in ("gate", "up")}
    own = [None] * experts
    for batch in activations(2, 50, 16, seed=12):
        rows = _routed(batch.reshape(-1, 16), experts, 2, gen)
        items = [(rows[e], held[e, name]) for e in range(experts) for name in ("gate", "up")]
        for (e, name), after in zip(held, acc.add_many(items)):
            held[e, name] = after
        own = [alone.add(rows[e].clone(), own[e]) for e in range(experts)]
    for e in range(experts - 1):
        assert held[e, "gate"] is held[e, "up"]
        assert torch.equal(held[e, "gate"], own[e]), e
    assert held[experts - 1, "gate"] is None and own[experts - 1] is None
    counts = acc.counters()
    assert counts["calls"] == 2 and counts["accumulations"] == counts["shared"] == 2 * (experts - 1)
    assert counts["rows"] == alone.counters()["rows"]


def test_partials_added_into_in_place_equal_add_manys_new_ones(cpu):
    """add_into writes each caller-held partial in place, bit for bit what add_many returns
    as a new tensor, blocks included; an item without rows leaves its partial alone."""
    experts, gen = 4, torch.Generator().manual_seed(21)
    acc, into = HessianAccumulator(cpu), HessianAccumulator(cpu)
    held = [None] * experts
    mine = [torch.zeros(16, 16) for _ in range(experts)]
    storage = [p.data_ptr() for p in mine]
    for batch in activations(3, 40, 16, seed=22):
        rows = _routed(batch.reshape(-1, 16), experts, 2, gen)
        blocks = [[r.shape[0] // 2, r.shape[0] - r.shape[0] // 2] for r in rows]
        held = acc.add_many([(r, h, b) for r, h, b in zip(rows, held, blocks)])
        into.add_into([(r, m, b) for r, m, b in zip(rows, mine, blocks)] + [(torch.empty(0, 16), mine[0])])
    for e in range(experts - 1):
        assert torch.equal(mine[e], held[e]), e
    assert [p.data_ptr() for p in mine] == storage and not mine[experts - 1].any()
    assert into.counters()["calls"] == 3 and into.counters()["rows"] == acc.counters()["rows"]


def test_a_refused_item_leaves_every_partial_of_the_call_as_it_was(cpu):
    acc = HessianAccumulator(cpu)
    partials = [acc.add(x, None) for x in activations(3, 10, 6, seed=13)]
    before, counts = [p.clone() for p in partials], acc.counters()
    items = [(x, p) for x, p in zip(activations(3, 10, 6, seed=14), partials)]
    items[2] = (torch.randn(10, 5), partials[2])
    with pytest.raises(errors.InvalidArgumentError, match=r"args->inputs\[2\] does not end in its partial's 6"):
        acc.add_many(items)
    assert all(torch.equal(p, b) for p, b in zip(partials, before)) and acc.counters() == counts


def test_named_partials_through_the_context(cpu):
    """Context.hessian_accumulate's input_partials (ABI 1.8): two partials of one device in
    one call, each equal to its inputs alone; a list of the wrong length refused by name."""
    xs = activations(3, 12, 8, seed=15)
    parts = [torch.zeros(8, 8), torch.zeros(8, 8)]
    cpu.hessian_accumulate(xs, parts, input_partials=[1, 0, 1])
    alone = [torch.zeros(8, 8), torch.zeros(8, 8)]
    for x, k in zip(xs, [1, 0, 1]):
        cpu.hessian_accumulate([x], [alone[k]])
    assert all(torch.equal(p, a) for p, a in zip(parts, alone)) and parts[0].abs().sum() > 0
    with pytest.raises(errors.InvalidArgumentError, match="input_partials has 2 entries for 3 inputs"):
        cpu.hessian_accumulate(xs, parts, input_partials=[0, 1])


def test_refusals_leave_the_partial_as_it_was(cpu):
    acc = HessianAccumulator(cpu)
    partial = acc.add(activations(1, 10, 6, seed=9)[0], None)
    before, counts = partial.clone(), acc.counters()
    for bad, why in ((torch.randn(10, 5), "args->inputs[0] does not end in its partial's 6 columns"),
                     (torch.randn(6, 10).T, "args->inputs[0]"),  # not contiguous
                     (torch.ones(10, 6, dtype=torch.int32), "args->inputs[0] is not float32, bfloat16 or float16")):
        with pytest.raises(errors.InvalidArgumentError, match=why.replace("[", r"\[").replace("]", r"\]")):
            acc.add(bad, partial)
        assert torch.equal(partial, before)
    assert acc.counters() == counts
    with pytest.raises(errors.InvalidArgumentError, match="precision = 'fast'"):
        HessianAccumulator(cpu, precision="fast").add(torch.randn(4, 6), partial)
    assert torch.equal(partial, before)


def test_a_failing_accumulation_leaves_the_partial_as_it_was(library):
    """The fault backend (asynchronous streams, no GPTQ engine) fails the native call after
    every argument was accepted: the caller's partial and the counters are as they were."""
    fault = os.path.join(os.path.dirname(library), "libqlink_backend_fault.so")
    if not os.path.exists(fault):
        pytest.skip("no fault backend beside %s" % library)
    config = {"backend": fault, "log_level": "off", "backend_options": {"devices": 2, "stream_delay_ms": [20, 0]}}
    with qlink.load(config, library=library) as ctx:
        acc = HessianAccumulator(ctx)
        partial = torch.full((6, 6), 3.0)
        with pytest.raises(errors.QlinkError, match="no GPTQ engine"):
            acc.add(torch.randn(5, 6), partial, device=0)
        assert torch.equal(partial, torch.full((6, 6), 3.0))
        assert acc.counters() == {"accumulations": 0, "shared": 0, "rows": 0, "calls": 0}
        assert not acc.made(partial)


def test_precision_per_call_and_from_the_config(library):
    """The CPU has no tensor cores: "tensor" gives the IEEE bytes, asked per accumulator or
    by the context's config."""
    x = activations(2, 30, 16, seed=10)
    results = []
    for config, precision in (({}, "ieee_fp32"), ({}, "tensor"), ({"hessian_precision": "tensor"}, None),
                              ({}, "tensor_gemm"), ({"hessian_precision": "tensor_gemm"}, None)):
        with qlink.load(dict(backend="cpu", log_level="off", **config), library=library) as ctx:
            acc, h = HessianAccumulator(ctx, precision=precision), None
            for b in x:
                h = acc.add(b, h)
            results.append(h)
    assert all(torch.equal(results[0], r) for r in results[1:])
