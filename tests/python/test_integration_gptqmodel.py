"""qlink.integrations.gptqmodel against a stand-in shaped like GPTQModel (tests/python/hosts)
on the CPU backend: every binding patched and restored, what runs through qlink and what
does not (counted, with reasons), strict mode, the Hessian merge in device order, and the
layer solve through an engine with the native engine's call."""
import os
import sys

import pytest
import torch

import gptq_engine_standin as engine
import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.patches import FallbackRefused

HOSTS = os.path.join(os.path.dirname(__file__), "hosts")


@pytest.fixture
def host(library):
    """The stand-in GPTQModel, freshly imported, and qlink installed into it (strict off)."""
    sys.path.insert(0, HOSTS)
    import gptqmodel
    from gptqmodel.looper import forward_executor, module_looper
    from gptqmodel.quantization import config, gptq
    from gptqmodel.utils import looper_helpers, model
    engine.CALLS.clear()
    ctx = qlink.load({"backend": "cpu", "cpu_devices": 4, "log_level": "off"}, library=library)
    yield dict(gptqmodel=gptqmodel, forward_executor=forward_executor, module_looper=module_looper, config=config,
               gptq=gptq, looper_helpers=looper_helpers, model=model, ctx=ctx)
    adapter.uninstall()
    sys.path.remove(HOSTS)
    for name in [n for n in sys.modules if n == "gptqmodel" or n.startswith("gptqmodel.")]:
        del sys.modules[name]


def _bindings(h):
    """Every place the host holds the functions the adapter replaces."""
    run_parallel = h["forward_executor"].ForwardExecutor.run_parallel
    return [h["looper_helpers"].clone_module_for_devices, h["forward_executor"].clone_module_for_devices,
            h["module_looper"].clone_module_for_devices, run_parallel.__kwdefaults__["clone_module_for_devices_fn"],
            h["looper_helpers"].torch_replicate, h["model"].move_to, h["looper_helpers"].move_to,
            h["forward_executor"].move_to, h["module_looper"].move_to, h["model"].nested_move_to,
            h["looper_helpers"].nested_move_to, h["forward_executor"].nested_move_to,
            h["gptq"].GPTQ.materialize_global_hessian, h["gptq"].GPTQ.quantize]


def test_install_rebinds_every_binding_and_uninstall_restores_them(host):
    before = _bindings(host)
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)
    after = _bindings(host)
    assert all(a is not b for a, b in zip(after, before))
    assert all(getattr(f, "__module__", "").startswith("qlink.") for f in after)
    # One replacement per original, wherever it was bound.
    assert len({id(f) for f in after[:4]}) == 1 and len({id(f) for f in after[5:9]}) == 1
    adapter.uninstall()
    assert all(a is b for a, b in zip(_bindings(host), before))
    assert adapter.counters() == {}


class Scaled(torch.nn.Linear):
    def forward(self, x, scale, flag):
        return super().forward(x) * scale[0] if flag else x


def test_a_forward_pass_runs_its_moves_through_qlink(host):
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)
    layer = Scaled(16, 16)
    inputs = [[torch.randn(2, 16)] for _ in range(4)]
    kwargs = [{"scale": [torch.tensor(2.0)], "flag": True} for _ in range(4)]
    outputs = host["forward_executor"].ForwardExecutor().run_parallel(
        module=layer, layer_inputs=inputs, layer_input_kwargs=kwargs, devices=[torch.device("cpu")])
    for out, x in zip(outputs, inputs):
        assert torch.equal(out, layer(x[0], [torch.tensor(2.0)], True))
    counts = adapter.counters()
    assert counts["move_to"]["qlink"] == 4 and counts["nested_move_to"]["qlink"] == 8
    # Host memory: the clone is the host's own (P2P is an accelerator concept), said so.
    assert counts["clone_module_for_devices"]["host"] == 1
    assert counts["clone_module_for_devices"]["reasons"] == {"host devices: P2P is an accelerator concept": 1}


def test_moves_the_engine_does_not_cover_go_to_the_host_counted(host):
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)
    move_to = host["model"].move_to
    assert move_to(torch.ones(3), "cpu", dtype=torch.float16).dtype == torch.float16
    assert adapter.counters()["move_to"]["reasons"] == {"a dtype conversion": 1}


def test_a_failing_qlink_path_falls_back_counted_or_raises_when_strict(host, monkeypatch):
    ctx = host["ctx"]

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    adapter.install(ctx=ctx, engine=engine.gptq_quantize)
    monkeypatch.setattr(ctx, "move_tensors", broken)
    assert torch.equal(host["forward_executor"].move_to(torch.arange(4.0), "cpu"), torch.arange(4.0))
    assert adapter.counters()["move_to"] == {"qlink": 0, "host": 0, "fallback": 1,
                                             "reasons": {"RuntimeError: injected": 1}}
    adapter.install(ctx=ctx, strict=True, engine=engine.gptq_quantize)
    with pytest.raises(FallbackRefused, match="move_to failed and strict=True.*injected"):
        host["module_looper"].move_to(torch.arange(4.0), "cpu")
    # A failing GPU clone: strict names the patch where GPTQModel would deep-copy.
    monkeypatch.setattr(ctx, "clone_module_for_devices", broken)
    with pytest.raises(FallbackRefused, match="torch_replicate failed.*injected"):
        host["looper_helpers"].clone_module_for_devices(torch.nn.Linear(4, 4), [torch.device("cuda", 0)])


def _partials(columns, seed):
    gen = torch.Generator().manual_seed(seed)
    return {torch.device("cuda", d): (lambda x: x.t() @ x)(torch.randn(50, columns, generator=gen)) for d in range(3)}


def _merge(host, partials, order):
    g = host["gptq"].GPTQ(torch.nn.Linear(64, 8))
    g._device_hessian_partials = {d: partials[d].clone() for d in order}
    g._device_sample_counts = {d: 50 for d in order}
    g._hessian_dirty = True
    g.materialize_global_hessian()
    return g.H


def test_the_hessian_merge_is_summed_in_device_order_whatever_the_arrival(host):
    partials = _partials(64, seed=0)
    devices = list(partials)
    orders = [devices, devices[::-1], [devices[1], devices[2], devices[0]]]
    arrival = [_merge(host, partials, o) for o in orders]  # the host's own merge: arrival order
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)
    merged = [_merge(host, partials, o) for o in orders]
    assert all(torch.equal(m, merged[0]) for m in merged)
    assert not all(torch.equal(a, arrival[0]) for a in arrival)  # what the patch fixes
    exact = sum(p.double() for p in partials.values()) * (2.0 / 150)
    assert torch.allclose(merged[0].double(), exact, rtol=5e-7, atol=5e-7)
    assert adapter.counters()["materialize_global_hessian"]["qlink"] == 3


def test_a_merge_qlink_cannot_hold_still_sums_in_device_order(host, library):
    """Five partials on a four-device CPU backend: the host's merge runs, on partials put
    in device order first, so it is deterministic too."""
    partials = {torch.device("cuda", d): p for d, p in enumerate(_partials(64, seed=1).values())}
    partials.update({torch.device("cuda", 3 + k): p * 0.5 for k, p in enumerate(list(partials.values())[:2])})
    devices = list(partials)
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)
    merged = [_merge(host, partials, o) for o in (devices, devices[::-1])]
    assert torch.equal(merged[0], merged[1])
    assert adapter.counters()["materialize_global_hessian"]["reasons"] == {
        "partials the cpu backend's 4 devices cannot hold": 2}


def _task(host, qcfg=None, layer=None, seed=0):
    torch.manual_seed(seed)
    layer = layer or torch.nn.Linear(256, 48)
    g = host["gptq"].GPTQ(layer, qcfg or host["config"].QuantizeConfig())
    g.quantizer.configure(perchannel=True)
    x = torch.randn(300, 32) @ torch.randn(32, 256) + 0.1 * torch.randn(300, 256)  # correlated, like activations
    g.add_batch(x, None)
    return g


@pytest.mark.parametrize("sym", [True, False])
def test_the_layer_solve_runs_through_the_engine_shaped_as_the_hosts(host, sym):
    qcfg = host["config"].QuantizeConfig(sym=sym, group_size=128, damp_percent=0.05)
    own = _task(host, qcfg).quantize()
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)
    g = _task(host, qcfg)
    q, scales, zeros, g_idx, duration, loss, damp, nsamples = g.quantize()
    assert engine.CALLS[-1] == dict(shape=(48, 256), dtype=torch.float32, bits=4, group_size=128, sym=sym,
                                    desc_act=False, static_groups=False, damp=0.05, damp_auto_increment=0.01,
                                    nsamples=300, act_group_aware=False, ctx=host["ctx"])
    assert q.shape == g.module.weight.shape and q.dtype == g.module.weight.dtype
    assert torch.allclose(q, own[0], atol=1e-5)
    assert torch.allclose(scales, own[1]) and torch.equal(zeros, own[2]) and torch.equal(g_idx, own[3])
    assert abs(loss / own[5] - 1) < 1e-4 and damp == own[6] and nsamples == own[7] == 300
    assert not hasattr(g, "H")  # done with, as the host's solve leaves it
    assert adapter.counters()["quantize"]["qlink"] == 1


@pytest.mark.parametrize("sym, group_size", [(True, 128), (False, 128), (True, -1)])
def test_the_layer_solve_runs_through_qlinks_native_engine(host, sym, group_size):
    """The real engine (qlink.quant.gptq_quantize on the CPU backend) in place of the host's
    column loop: the same levels, grids and weights up to rounding, the same loss. (The
    engine's factorizations and PyTorch's round apart: a later group's range, taken after
    the error feedback, differs in its last bits, and a flipped level carries along its row,
    as in the engine's own tests.)"""
    qcfg = host["config"].QuantizeConfig(sym=sym, group_size=group_size, damp_percent=0.05)
    own = _task(host, qcfg).quantize()
    adapter.install(ctx=host["ctx"])
    q, scales, zeros, g_idx, _, loss, damp, nsamples = _task(host, qcfg).quantize()
    assert adapter.counters()["quantize"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    assert q.shape == own[0].shape and q.dtype == own[0].dtype and scales.shape == own[1].shape
    assert torch.equal(g_idx, own[3])
    g = g_idx.long()
    levels, own_levels = (torch.round(w / s[:, g] + z[:, g]) for w, s, z in ((q, scales, zeros), own[:3]))
    assert (levels == own_levels).float().mean() > 0.99
    same = (levels == own_levels).all(1)  # rows on the same levels: grids and weights equal to float noise
    assert torch.allclose(scales[same], own[1][same], rtol=1e-5) and torch.equal(zeros[same], own[2][same])
    assert torch.allclose(q[same], own[0][same], rtol=1e-5, atol=1e-7)
    assert abs(loss / own[5] - 1) < 1e-3 and damp == pytest.approx(own[6]) and nsamples == own[7]


def test_group_aware_reordering_runs_through_qlinks_native_engine(host):
    """GPTQModel's default without desc_act (act_group_aware) is the engine's option: the
    solve is qlink's, the same as calling the engine with it on the merged Hessian."""
    import qlink.quant

    qcfg = host["config"].QuantizeConfig(group_size=32, act_group_aware=True)
    adapter.install(ctx=host["ctx"], strict=True)  # both Hessians from the add_batch patch
    g = _task(host, qcfg)
    g.finalize_hessian()
    want = qlink.quant.gptq_quantize(g.module.weight.data, g.H.clone(), group_size=32, act_group_aware=True,
                                     damp=qcfg.damp_percent, nsamples=g.nsamples, ctx=host["ctx"])
    q, scales, zeros, g_idx, _, loss, damp, _ = _task(host, qcfg).quantize()
    assert adapter.counters()["quantize"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    assert torch.equal(q, want.weight) and torch.equal(scales, want.scales) and torch.equal(zeros, want.zeros)
    assert torch.equal(g_idx, torch.arange(256, dtype=torch.int32) // 32) and loss == want.loss


@pytest.mark.parametrize("change, reason", [
    (dict(mse=2.4), "mse > 0 (a scale search per group)"),
    (dict(act_group_aware=True, static_groups=True), "act_group_aware with static_groups"),
    (dict(mock_quantization=True), "mock_quantization"),
    (dict(bits=5), "bits=5"),
    (dict(fallback=1e9), "a fallback strategy for too few samples"),
])
def test_options_the_engine_does_not_cover_go_to_the_hosts_solve(host, change, reason):
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)
    calls = len(engine.CALLS)
    qcfg = host["config"].QuantizeConfig(**change)
    g = _task(host, qcfg)
    if change.get("fallback"):
        with pytest.raises(NotImplementedError):  # the stand-in host has no fallback strategies
            g.quantize()
    else:
        g.quantize()
    assert len(engine.CALLS) == calls
    assert adapter.counters()["quantize"]["reasons"] == {reason: 1}


def test_a_subclass_or_another_layer_type_keeps_its_own_solve(host):
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)

    class Tuned(host["gptq"].GPTQ):
        pass

    Tuned(torch.nn.Linear(128, 8)).quantizer.configure(perchannel=True)
    task = _task(host)
    task.__class__ = Tuned
    task.quantize()
    assert adapter.counters()["quantize"]["reasons"] == {"a GPTQ subclass (Tuned) with its own solve": 1}


def test_an_engine_refusal_falls_back_or_raises_when_strict(host):
    qcfg = host["config"].QuantizeConfig(desc_act=True)  # the stand-in engine refuses it
    adapter.install(ctx=host["ctx"], engine=engine.gptq_quantize)
    _task(host, qcfg).quantize()
    assert adapter.counters()["quantize"]["fallback"] == 1
    adapter.install(ctx=host["ctx"], strict=True, engine=engine.gptq_quantize)
    with pytest.raises(FallbackRefused, match="quantize failed.*neither desc_act"):
        _task(host, qcfg).quantize()


def test_without_the_native_engine_every_solve_is_the_hosts_saying_why(host, monkeypatch):
    import qlink.quant

    def old_call(w, h, bits=4, group_size=128, damp=0.01):
        raise AssertionError("not the native engine: never called")

    monkeypatch.setattr(qlink.quant, "gptq_quantize", old_call)
    adapter.install(ctx=host["ctx"])
    _task(host).quantize()
    (reason, count), = adapter.counters()["quantize"]["reasons"].items()
    assert count == 1
    assert reason.startswith("qlink.quant.gptq_quantize is not the native engine's call (no weight, hessian, sym")
