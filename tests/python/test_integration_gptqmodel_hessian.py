"""The add_batch patch of qlink.integrations.gptqmodel against the stand-in GPTQModel
(tests/python/hosts) on the CPU backend: a decoder layer's hooks feeding GPTQ tasks as
GPTQModel's loop does, the Hessians through qlink (q/k/v and gate/up sharing one
accumulation) equal to GPTQModel's own, what falls back and why, strict mode, and a failing
accumulation leaving the task as it was."""
import os

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.patches import FallbackRefused

from stand_in_hosts import stand_in

HIDDEN, INTER = 32, 48
NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.looper import gptq_processor
        from gptqmodel.quantization import config, gptq
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library)
        yield dict(gptq=gptq, gptq_processor=gptq_processor, config=config, ctx=ctx, library=library)


class Layer(torch.nn.Module):
    """A LLaMA-shaped decoder layer's linears, called as its forward calls them."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        shapes = dict(q_proj=(HIDDEN, HIDDEN), k_proj=(HIDDEN, HIDDEN), v_proj=(HIDDEN, HIDDEN),
                      o_proj=(HIDDEN, HIDDEN), gate_proj=(HIDDEN, INTER), up_proj=(HIDDEN, INTER),
                      down_proj=(INTER, HIDDEN))
        for name, (i, o) in shapes.items():
            setattr(self, name, torch.nn.Linear(i, o, bias=False, dtype=dtype))

    def forward(self, x):
        h = torch.nn.functional.layer_norm(x, (HIDDEN,))
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        x = x + self.o_proj(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)
        h = torch.nn.functional.layer_norm(x, (HIDDEN,))
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


def calibrate(host, dtype=torch.bfloat16, batches=3):
    """GPTQModel's loop for one layer: a GPTQ task per linear, a forward hook feeding it
    (inp[0].data, as its hook does), the batches run; each task's Hessian merged."""
    layer = Layer(dtype)
    tasks = {}
    handles = []
    for name in NAMES:
        g = host["gptq_processor"].GPTQ(getattr(layer, name), host["config"].QuantizeConfig())
        g.name = name
        tasks[name] = g
        handles.append(getattr(layer, name).register_forward_hook(
            lambda m, inp, out, g=g, b=[0]: g.add_batch(inp[0].data, out.data, batch_index=b[0])))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(batches):
            layer(torch.randn(1, 20, HIDDEN, generator=gen).to(dtype))
    for h in handles:
        h.remove()
    adapter.flush_hessians()  # the last forward's calls, queued (GPTQModel reads through its merge)
    partials = {name: dict(g._device_hessian_partials) for name, g in tasks.items()}
    for g in tasks.values():
        g.finalize_hessian()
    return tasks, partials


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_layers_hessians_equal_gptqmodels_own_with_shared_accumulations(host, dtype):
    own, _ = calibrate(host, dtype)
    adapter.install(ctx=host["ctx"], strict=True)
    mine, partials = calibrate(host, dtype)
    cpu = torch.device("cpu")
    assert partials["q_proj"][cpu] is partials["k_proj"][cpu] is partials["v_proj"][cpu]
    assert partials["gate_proj"][cpu] is partials["up_proj"][cpu]
    assert partials["o_proj"][cpu] is not partials["q_proj"][cpu]
    for name in NAMES:
        assert mine[name].nsamples == own[name].nsamples == 60, name
        assert torch.allclose(mine[name].H, own[name].H, rtol=1e-5, atol=1e-6), name
        assert not mine[name]._hessian_dirty and not mine[name]._device_hessian_partials
    assert torch.equal(mine["q_proj"].H, mine["v_proj"].H) and torch.equal(mine["gate_proj"].H, mine["up_proj"].H)
    # One native call per forward: every module's batch queued, made when the next batch comes.
    assert adapter.counters()["hessians"] == {"accumulations": 3 * 4, "shared": 3 * 3, "rows": 3 * 4 * 20, "calls": 3}
    assert adapter.counters()["seams"]["add_batch"] == {"qlink": 21, "host": 0, "fallback": 0, "reasons": {}}
    assert adapter.counters()["seams"]["materialize_global_hessian"]["qlink"] == 7


@pytest.mark.parametrize("asked, sent", [({}, "tensor_gemm"), ({"hessian_precision": "ieee_fp32"}, "ieee_fp32"),
                                         ({"hessian_precision": None}, None)])
def test_the_loops_hessians_take_installs_precision(host, monkeypatch, asked, sent):
    """install's hessian_precision (tensor_gemm unless asked) reaches every native call."""
    seen = []
    accumulate = host["ctx"].hessian_accumulate

    def spying(*args, **kwargs):
        seen.append(kwargs["precision"])
        return accumulate(*args, **kwargs)
    monkeypatch.setattr(host["ctx"], "hessian_accumulate", spying)
    adapter.install(ctx=host["ctx"], strict=True, **asked)
    calibrate(host, torch.bfloat16)
    assert seen and set(seen) == {sent}
    with pytest.raises(ValueError, match="hessian_precision must be one of .*got 'fp64'"):
        adapter.install(ctx=host["ctx"], hessian_precision="fp64")


class MoE(torch.nn.Module):
    """An MoE block as GPTQModel calibrates it once split (transformers' eager experts loop):
    a router's top-2 per token, each routed expert's gate/up on its rows, down on theirs;
    the last expert never chosen."""

    def __init__(self, experts=6, dtype=torch.bfloat16):
        super().__init__()
        torch.manual_seed(3)
        self.router = torch.nn.Linear(HIDDEN, experts, bias=False, dtype=dtype)
        self.experts = torch.nn.ModuleList()
        for _ in range(experts):
            e = torch.nn.Module()
            e.gate_proj, e.up_proj = (torch.nn.Linear(HIDDEN, INTER, bias=False, dtype=dtype) for _ in range(2))
            e.down_proj = torch.nn.Linear(INTER, HIDDEN, bias=False, dtype=dtype)
            self.experts.append(e)

    def forward(self, x):
        tokens = x.reshape(-1, HIDDEN)
        logits = self.router(tokens).float()
        logits[:, -1] = -float("inf")
        weights, chosen = torch.topk(logits.softmax(-1), 2, dim=-1)
        out = torch.zeros_like(tokens)
        for i, e in enumerate(self.experts):
            rows, slot = torch.where(chosen == i)
            if rows.numel() == 0:
                continue
            h = tokens[rows]
            y = e.down_proj(torch.nn.functional.silu(e.gate_proj(h)) * e.up_proj(h))
            out.index_add_(0, rows, y * weights[rows, slot, None].to(y.dtype))
        return out.view_as(x)


def calibrate_moe(host, batches=3):
    moe, tasks = MoE(), {}
    for i, e in enumerate(moe.experts):
        for name in ("gate_proj", "up_proj", "down_proj"):
            g = host["gptq_processor"].GPTQ(getattr(e, name), host["config"].QuantizeConfig())
            g.name = "experts.%d.%s" % (i, name)
            tasks[g.name] = g
            getattr(e, name).register_forward_hook(lambda m, inp, out, g=g: g.add_batch(inp[0].data, out.data))
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for _ in range(batches):
            moe(torch.randn(1, 40, HIDDEN, generator=gen).to(torch.bfloat16))
    adapter.flush_hessians()
    partials = {name: dict(g._device_hessian_partials) for name, g in tasks.items()}
    for g in tasks.values():
        g.finalize_hessian()
    return tasks, partials


def test_an_moe_blocks_experts_land_in_one_native_call_per_forward(host):
    """Every routed expert's gate, up and down of one forward in one hessian_accumulate (gate
    and up sharing), each expert's Hessian equal to GPTQModel's own; the expert no token
    chose has no samples and no partial, as with GPTQModel."""
    own, _ = calibrate_moe(host)
    adapter.install(ctx=host["ctx"], strict=True)
    mine, partials = calibrate_moe(host)
    cpu = torch.device("cpu")
    routed = [i for i in range(6) if own["experts.%d.gate_proj" % i].nsamples]
    assert routed == [0, 1, 2, 3, 4]
    for i in routed:
        assert partials["experts.%d.gate_proj" % i][cpu] is partials["experts.%d.up_proj" % i][cpu]
        for name in ("gate_proj", "up_proj", "down_proj"):
            key = "experts.%d.%s" % (i, name)
            assert mine[key].nsamples == own[key].nsamples > 0, key
            assert torch.allclose(mine[key].H, own[key].H, rtol=1e-5, atol=1e-6), key
    assert mine["experts.5.gate_proj"].nsamples == 0 and not partials["experts.5.down_proj"]
    assert all(mine[key].fwd_counter == own[key].fwd_counter for key in own)
    counts = adapter.counters()["hessians"]
    assert counts["calls"] == 3 and counts["accumulations"] == 3 * 2 * len(routed) == counts["shared"] * 2


def test_the_counts_gptqmodel_reads_between_forwards_move_before_the_flush(host):
    """GPTQModel asks each task's fwd_counter after a subset's forwards (which experts were
    reached) without merging: a queued call counts at once; its partial lands with the flush."""
    adapter.install(ctx=host["ctx"], strict=True)
    moe = MoE()
    tasks = {}
    for i, e in enumerate(moe.experts):
        g = host["gptq_processor"].GPTQ(e.down_proj, host["config"].QuantizeConfig())
        tasks[i] = g
        e.down_proj.register_forward_hook(lambda m, inp, out, g=g: g.add_batch(inp[0].data, out.data))
    with torch.no_grad():
        moe(torch.randn(1, 40, HIDDEN).to(torch.bfloat16))
    reached = [i for i, g in tasks.items() if g.fwd_counter]
    assert reached and 5 not in reached and all(tasks[i].nsamples > 0 for i in reached)
    assert not any(tasks[i]._device_hessian_partials for i in reached)  # queued
    adapter.flush_hessians()
    assert all(torch.device("cpu") in tasks[i]._device_hessian_partials for i in reached)
    assert adapter.counters()["hessians"]["calls"] == 1


class Affine(torch.nn.Module):
    """A layer the patch does not take (GPTQModel reshapes a convolution's input itself)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 16))


def test_what_the_patch_does_not_take_runs_gptqmodels_own_counted(host):
    adapter.install(ctx=host["ctx"])
    g = host["gptq_processor"].GPTQ(Affine(), host["config"].QuantizeConfig())
    g.add_batch(torch.randn(5, 16), None)
    wide = host["gptq_processor"].GPTQ(torch.nn.Linear(16, 8), host["config"].QuantizeConfig())
    wide.add_batch(torch.randn(5, 16, dtype=torch.float64), None)
    assert g.nsamples == wide.nsamples == 5
    assert adapter.counters()["seams"]["add_batch"]["reasons"] == {
        "a Affine layer (its input is reshaped by GPTQModel)": 1, "a float64 input": 1}
    assert adapter.counters()["hessians"]["accumulations"] == 0


def test_strict_raises_naming_the_layer_and_the_reason(host):
    adapter.install(ctx=host["ctx"], strict=True)
    g = host["gptq_processor"].GPTQ(torch.nn.Linear(16, 8), host["config"].QuantizeConfig())
    g.name = "model.layers.0.mlp.down_proj"
    with pytest.raises(FallbackRefused, match="layer 'model.layers.0.mlp.down_proj': a float64 input"):
        g.add_batch(torch.randn(5, 16, dtype=torch.float64), None)
    assert g.nsamples == 0 and not g._device_hessian_partials


def test_a_host_batch_after_shared_ones_does_not_touch_the_other_layers(host):
    """GPTQModel adds in place; a partial q/k/v share is copied first, so only q changes."""
    adapter.install(ctx=host["ctx"])
    tasks = [host["gptq_processor"].GPTQ(torch.nn.Linear(16, 16), host["config"].QuantizeConfig()) for _ in range(3)]
    x = torch.randn(10, 16)
    for g in tasks:
        g.add_batch(x, None)
    adapter.flush_hessians()
    shared = tasks[0]._device_hessian_partials[torch.device("cpu")]
    before = shared.clone()
    tasks[0].add_batch(torch.randn(10, 16, dtype=torch.float64), None)  # the host's own add_batch
    assert tasks[1]._device_hessian_partials[torch.device("cpu")] is shared
    assert torch.equal(shared, before) and torch.equal(tasks[2]._device_hessian_partials[torch.device("cpu")], before)
    assert not torch.equal(tasks[0]._device_hessian_partials[torch.device("cpu")], before)
    assert tasks[0].nsamples == 20 and tasks[1].nsamples == 10


def _fault_context(library):
    fault = os.path.join(os.path.dirname(library), "libqlink_backend_fault.so")
    if not os.path.exists(fault):
        pytest.skip("no fault backend beside %s" % library)
    return qlink.load({"backend": fault, "log_level": "off", "backend_options": {"devices": 2}}, library=library)


def test_a_failing_accumulation_leaves_the_task_as_it_was(host):
    """The fault backend fails qlink's accumulation (it has no GPTQ engine): strict raises with
    the task's partials, counts and flags as they were; otherwise GPTQModel's own add_batch
    runs, counted as a fallback, on the untouched state."""
    first, second = torch.randn(6, 16), torch.randn(4, 16)

    def task():  # a task the processor builds while installed, with a first batch of GPTQModel's own
        g = host["gptq_processor"].GPTQ(torch.nn.Linear(16, 8), host["config"].QuantizeConfig())
        g.name = "q_proj"
        host["gptq"].GPTQ.add_batch(g, first, None)
        return g

    adapter.install(ctx=_fault_context(host["library"]), strict=True)
    g = task()
    partial = g._device_hessian_partials[torch.device("cpu")]
    state = (partial.clone(), dict(g._device_sample_counts), g.nsamples, g._hessian_dirty, g.fwd_counter)
    g.add_batch(second, None)  # queued: made with the forward's other calls, counted at once
    assert g.nsamples == 10 and g.fwd_counter == 2
    with pytest.raises(FallbackRefused, match="layer 'q_proj': UnavailableError: the fault backend has no GPTQ"):
        adapter.flush_hessians()
    assert g._device_hessian_partials[torch.device("cpu")] is partial
    assert (torch.equal(partial, state[0]) and g._device_sample_counts == state[1] and g.nsamples == state[2]
            and g._hessian_dirty == state[3] and g.fwd_counter == state[4])
    adapter.install(ctx=_fault_context(host["library"]))
    g = task()
    g.add_batch(second, None)
    adapter.flush_hessians()
    assert g.nsamples == 10
    assert torch.allclose(g._device_hessian_partials[torch.device("cpu")], first.T @ first + second.T @ second,
                          rtol=1e-5, atol=1e-5)
    counts = adapter.counters()["seams"]["add_batch"]
    assert counts["fallback"] == 1 and counts["qlink"] == 0
    assert list(counts["reasons"]) == ["UnavailableError: the fault backend has no GPTQ engine"]


def test_uninstall_lands_the_queue_and_restores_the_host_even_when_it_fails(host):
    """uninstall() makes the queued calls (nothing is lost with the patches); a flush that
    fails under strict raises, and GPTQModel's add_batch is its own again all the same."""
    original = host["gptq"].GPTQ.add_batch
    adapter.install(ctx=host["ctx"], strict=True)
    g = host["gptq_processor"].GPTQ(torch.nn.Linear(16, 8), host["config"].QuantizeConfig())
    g.add_batch(torch.randn(5, 16), None)
    adapter.uninstall()
    assert torch.device("cpu") in g._device_hessian_partials and host["gptq"].GPTQ.add_batch is original
    adapter.install(ctx=_fault_context(host["library"]), strict=True)
    g = host["gptq_processor"].GPTQ(torch.nn.Linear(16, 8), host["config"].QuantizeConfig())
    g.name = "o_proj"
    g.add_batch(torch.randn(5, 16), None)
    with pytest.raises(FallbackRefused, match="layer 'o_proj'"):
        adapter.uninstall()
    assert host["gptq"].GPTQ.add_batch is original and g.nsamples == 0
