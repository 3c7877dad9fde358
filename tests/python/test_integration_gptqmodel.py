"""qlink.integrations.gptqmodel against a stand-in shaped like GPTQModel (tests/python/hosts)
on the CPU backend: every binding patched and restored, what runs through qlink and what
does not (counted, with reasons), strict mode, the Hessian merge in device order, and the
layer solve through qlink's native engine (a recorder around it keeps its calls)."""
import threading
import time

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel import solve
from qlink.integrations.patches import FallbackRefused

from stand_in_hosts import stand_in


@pytest.fixture
def host(library):
    """The stand-in GPTQModel, freshly imported, and qlink installed into it (strict off)."""
    with stand_in("gptqmodel", adapter):
        import gptqmodel
        from gptqmodel.looper import forward_executor, module_looper
        from gptqmodel.looper import gptq_processor
        from gptqmodel.quantization import config, gptq
        from gptqmodel.utils import looper_helpers, model
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 4, "log_level": "off"}, library=library)
        yield dict(gptqmodel=gptqmodel, forward_executor=forward_executor, module_looper=module_looper, config=config,
                   gptq=gptq, gptq_processor=gptq_processor, looper_helpers=looper_helpers, model=model, ctx=ctx)


@pytest.fixture
def engine_calls(monkeypatch):
    """The options of every call the adapter makes to qlink's native engine, which it
    still runs."""
    calls, engine = [], solve.parallel_gptq

    def recorder(layers, placement, **options):
        calls.append([dict(options, shape=tuple(layer.weight.shape), dtype=layer.weight.dtype) for layer in layers])
        return engine(layers, placement, **options)

    monkeypatch.setattr(solve, "parallel_gptq", recorder)
    return calls


def _bindings(h):
    """Every place the host holds the functions the adapter replaces."""
    run_parallel = h["forward_executor"].ForwardExecutor.run_parallel
    return [h["looper_helpers"].clone_module_for_devices, h["forward_executor"].clone_module_for_devices,
            h["module_looper"].clone_module_for_devices, run_parallel.__kwdefaults__["clone_module_for_devices_fn"],
            h["looper_helpers"].torch_replicate, h["model"].move_to, h["looper_helpers"].move_to,
            h["forward_executor"].move_to, h["module_looper"].move_to, h["model"].nested_move_to,
            h["looper_helpers"].nested_move_to, h["forward_executor"].nested_move_to,
            h["gptq_processor"].GPTQ]


def test_install_rebinds_every_binding_and_uninstall_restores_them(host):
    before = _bindings(host)
    adapter.install(ctx=host["ctx"])
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
    adapter.install(ctx=host["ctx"])
    layer = Scaled(16, 16)
    inputs = [[torch.randn(2, 16)] for _ in range(4)]
    kwargs = [{"scale": [torch.tensor(2.0)], "flag": True} for _ in range(4)]
    outputs = host["forward_executor"].ForwardExecutor().run_parallel(
        module=layer, layer_inputs=inputs, layer_input_kwargs=kwargs, devices=[torch.device("cpu")])
    for out, x in zip(outputs, inputs):
        assert torch.equal(out, layer(x[0], [torch.tensor(2.0)], True))
    counts = adapter.counters()["seams"]
    assert counts["move_to"]["qlink"] == 4 and counts["nested_move_to"]["qlink"] == 8
    # Host memory: the clone is the host's own (P2P is an accelerator concept), said so.
    assert counts["clone_module_for_devices"]["host"] == 1
    assert counts["clone_module_for_devices"]["reasons"] == {"CPU devices: P2P is an accelerator concept": 1}


def test_moves_the_engine_does_not_cover_go_to_the_host_counted(host):
    adapter.install(ctx=host["ctx"])
    move_to = host["model"].move_to
    assert move_to(torch.ones(3), "cpu", dtype=torch.float16).dtype == torch.float16
    assert adapter.counters()["seams"]["move_to"]["reasons"] == {"a dtype conversion": 1}


def test_a_failing_qlink_path_falls_back_counted_or_raises_when_strict(host, monkeypatch):
    ctx = host["ctx"]

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    adapter.install(ctx=ctx)
    monkeypatch.setattr(ctx, "move_tensors", broken)
    assert torch.equal(host["forward_executor"].move_to(torch.arange(4.0), "cpu"), torch.arange(4.0))
    assert adapter.counters()["seams"]["move_to"] == {"qlink": 0, "host": 0, "fallback": 1,
                                                      "reasons": {"RuntimeError: injected": 1}}
    adapter.install(ctx=ctx, strict=True)
    with pytest.raises(FallbackRefused, match="move_to failed and strict=True.*injected"):
        host["module_looper"].move_to(torch.arange(4.0), "cpu")
    # A failing GPU clone: strict names the patch where GPTQModel would deep-copy.
    monkeypatch.setattr(ctx, "clone_module_for_devices", broken)
    with pytest.raises(FallbackRefused, match="torch_replicate failed.*injected"):
        host["looper_helpers"].clone_module_for_devices(torch.nn.Linear(4, 4), [torch.device("cuda", 0)])


class HostError(Exception):
    """Raised by the host's own code: never qlink's to catch."""


def test_the_hosts_own_errors_in_a_clone_propagate_once_never_a_fallback(host):
    """clone_module_for_devices calls the host's clear_state_fn on qlink's path: what it
    raises is the host's, raised as it is, and nothing runs a second time."""
    adapter.install(ctx=host["ctx"])
    cleared = []

    def clear(module):
        cleared.append(module)
        raise HostError("the host's clear")

    layer = torch.nn.Linear(4, 4)
    with pytest.raises(HostError, match="the host's clear"):
        host["looper_helpers"].clone_module_for_devices(layer, [torch.device("cuda", 0)], clear_state_fn=clear)
    assert cleared == [layer]
    counts = adapter.counters()["seams"]
    assert counts["clone_module_for_devices"]["fallback"] == 0 and counts["torch_replicate"]["fallback"] == 0


def test_a_failing_replicate_falls_back_to_the_hosts_replicate_alone(host, monkeypatch):
    """qlink's replicas fail after the host's callbacks staged the module: the fallback is
    the host's replicate step only (the staging is not run again), and what the host's
    replicate raises is its own."""
    ctx = host["ctx"]
    adapter.install(ctx=ctx)
    calls = []

    def qlink_fails(*args, **kwargs):
        raise RuntimeError("injected")

    def host_replicate(module, devices, detach=True):
        calls.append("replicate")
        raise HostError("the host's replicate")

    monkeypatch.setattr(ctx, "clone_module_for_devices", qlink_fails)
    monkeypatch.setattr(torch.nn.parallel, "replicate", host_replicate)
    with pytest.raises(HostError, match="the host's replicate"):
        host["looper_helpers"].clone_module_for_devices(torch.nn.Linear(4, 4), [torch.device("cuda", 0)],
                                                        clear_state_fn=lambda m: calls.append("clear"))
    assert calls == ["clear", "replicate"]
    counts = adapter.counters()["seams"]
    assert counts["torch_replicate"]["reasons"] == {"RuntimeError: injected": 1}
    assert counts["clone_module_for_devices"]["fallback"] == 0


def test_the_hosts_own_errors_in_a_solve_propagate_once_never_a_fallback(host):
    """GPTQ.quantize's qlink path starts with the host's Hessian merge: what it raises is
    the host's, raised once, not a fallback into the host's solve (which would merge again)."""
    adapter.install(ctx=host["ctx"])
    g, asked = _task(host), []

    def target(requested):
        asked.append(requested)
        raise HostError("the host's target device")

    g._select_hessian_target_device = target
    with pytest.raises(HostError, match="the host's target device"):
        g.quantize()
    assert len(asked) == 1
    assert adapter.counters()["seams"]["quantize"]["fallback"] == 0


def _partials(columns, seed):
    gen = torch.Generator().manual_seed(seed)
    return {torch.device("cuda", d): (lambda x: x.t() @ x)(torch.randn(50, columns, generator=gen)) for d in range(3)}


def _merge(host, partials, order):
    g = host["gptq_processor"].GPTQ(torch.nn.Linear(64, 8))
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
    adapter.install(ctx=host["ctx"])
    merged = [_merge(host, partials, o) for o in orders]
    assert all(torch.equal(m, merged[0]) for m in merged)
    assert not all(torch.equal(a, arrival[0]) for a in arrival)  # what the patch fixes
    exact = sum(p.double() for p in partials.values()) * (2.0 / 150)
    assert torch.allclose(merged[0].double(), exact, rtol=5e-7, atol=5e-7)
    assert adapter.counters()["seams"]["materialize_global_hessian"]["qlink"] == 3


def test_tasks_of_one_input_merging_at_once_make_one_hessian(host, monkeypatch):
    """q, k and v on GPTQModel's workers merge their shared partials together: one
    qlink.reduce, one merged tensor for the three (two made at once would be a second
    Hessian for the engine, and its memory)."""
    adapter.install(ctx=host["ctx"])
    partials = {d: p.contiguous() for d, p in list(_partials(256, seed=2).items())[:2]}
    tasks = [host["gptq_processor"].GPTQ(torch.nn.Linear(256, 48), host["config"].QuantizeConfig()) for _ in range(3)]
    for g in tasks:  # as qlink's add_batch leaves a subset's tasks of one input
        g.quantizer.configure(perchannel=True)
        g._device_hessian_partials = dict(partials)
        g._device_sample_counts = {d: 50 for d in partials}
        g.nsamples, g._hessian_dirty = 100, True
    reduce, calls = host["ctx"].reduce, []

    def slow_reduce(*args, **kwargs):
        calls.append(1)
        time.sleep(0.2)  # long enough for the other workers to reach the merge
        return reduce(*args, **kwargs)
    monkeypatch.setattr(host["ctx"], "reduce", slow_reduce)
    start = threading.Barrier(len(tasks))

    def worker(g):
        start.wait()
        g.materialize_global_hessian()
    threads = [threading.Thread(target=worker, args=(g,)) for g in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert all(g.H is tasks[0].H for g in tasks)
    assert adapter.counters()["seams"]["materialize_global_hessian"]["qlink"] == 3


def test_a_merge_qlink_cannot_hold_still_sums_in_device_order(host, library):
    """Five partials on a four-device CPU backend: the host's merge runs, on partials put
    in device order first, so it is deterministic too."""
    partials = {torch.device("cuda", d): p for d, p in enumerate(_partials(64, seed=1).values())}
    partials.update({torch.device("cuda", 3 + k): p * 0.5 for k, p in enumerate(list(partials.values())[:2])})
    devices = list(partials)
    adapter.install(ctx=host["ctx"])
    merged = [_merge(host, partials, o) for o in (devices, devices[::-1])]
    assert torch.equal(merged[0], merged[1])
    assert adapter.counters()["seams"]["materialize_global_hessian"]["reasons"] == {
        "partials the cpu backend's 4 devices cannot hold": 2}


def _task(host, qcfg=None, layer=None, seed=0, dead=()):
    """A GPTQ task; `dead`: input columns no calibration row reaches (zero Hessian
    diagonal), each holding its rows' extremes in the weight."""
    torch.manual_seed(seed)
    layer = layer or torch.nn.Linear(256, 48)
    g = host["gptq_processor"].GPTQ(layer, qcfg or host["config"].QuantizeConfig())
    g.quantizer.configure(perchannel=True)
    x = torch.randn(300, 32) @ torch.randn(32, 256) + 0.1 * torch.randn(300, 256)  # correlated, like activations
    for c in dead:
        x[:, c] = 0
        with torch.no_grad():
            extreme = 3 * layer.weight.abs().amax(1)
            layer.weight[:, c] = torch.where(torch.arange(layer.out_features) % 2 == 0, extreme, -extreme)
    g.add_batch(x, None)
    return g


@pytest.mark.parametrize("sym, group_size", [(True, 128), (False, 128), (True, -1)])
def test_the_layer_solve_runs_through_qlinks_native_engine(host, engine_calls, sym, group_size):
    """The real engine (qlink.quant.gptq_quantize on the CPU backend) in place of the host's
    column loop: the same levels, grids and weights up to rounding, the same loss. (The
    engine's factorizations and PyTorch's round apart: a later group's range, taken after
    the error feedback, differs in its last bits, and a flipped level carries along its row,
    as in the engine's own tests.)"""
    qcfg = host["config"].QuantizeConfig(sym=sym, group_size=group_size, damp_percent=0.05)
    own = _task(host, qcfg).quantize()
    adapter.install(ctx=host["ctx"])
    g = _task(host, qcfg)
    q, scales, zeros, g_idx, _, loss, damp, nsamples = g.quantize()
    assert adapter.counters()["seams"]["quantize"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    # One layer in one call; the engine's loss sum divided by the task's samples afterwards.
    assert engine_calls == [[dict(shape=(48, 256), dtype=torch.float32, bits=4, group_size=group_size, sym=sym,
                                  desc_act=False, static_groups=False, damp=0.05, damp_auto_increment=0.01,
                                  nsamples=0, act_group_aware=False, inverse="triangular",
                                  tf32=True, ctx=host["ctx"])]]
    assert not hasattr(g, "H")  # done with, as the host's solve leaves it
    assert q.shape == own[0].shape and q.dtype == own[0].dtype and scales.shape == own[1].shape
    assert torch.equal(g_idx, own[3])
    g = g_idx.long()
    levels, own_levels = (torch.round(w / s[:, g] + z[:, g]) for w, s, z in ((q, scales, zeros), own[:3]))
    assert (levels == own_levels).float().mean() > 0.99
    same = (levels == own_levels).all(1)  # rows on the same levels: grids and weights equal to float noise
    assert torch.allclose(scales[same], own[1][same], rtol=1e-5) and torch.equal(zeros[same], own[2][same])
    assert torch.allclose(q[same], own[0][same], rtol=1e-5, atol=1e-7)
    assert abs(loss / own[5] - 1) < 1e-3 and damp == pytest.approx(own[6]) and nsamples == own[7]


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("static_groups", [False, True])
def test_group_size_minus_one_takes_each_rows_range_before_its_dead_columns_go(host, sym, static_groups):
    """GPTQModel's GPTQ.quantize with group_size -1 takes each row's range from the whole
    weight, then zeroes the dead columns: a dead column holding a row's extreme sets that
    row's scale, unlike a group as wide as the row (its range taken after). static_groups
    does nothing with -1 in GPTQModel, so it is no reason to leave qlink's solve either."""
    qcfg = host["config"].QuantizeConfig(sym=sym, group_size=-1, static_groups=static_groups, damp_percent=0.05)
    own = _task(host, qcfg, dead=(5, 200)).quantize()
    adapter.install(ctx=host["ctx"], strict=True)
    q, scales, zeros, g_idx, _, loss, damp, nsamples = _task(host, qcfg, dead=(5, 200)).quantize()
    assert adapter.counters()["seams"]["quantize"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    assert scales.shape == own[1].shape == (48, 1)
    assert torch.equal(scales, own[1]) and torch.equal(zeros, own[2]) and torch.equal(g_idx, own[3])
    assert torch.equal(q[:, [5, 200]], torch.zeros(48, 2))  # the dead columns themselves are zeroed, as the host's
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
                                     damp=qcfg.damp_percent, nsamples=g.nsamples, ctx=host["ctx"],
                                     inverse="triangular", tf32=True)  # install()'s defaults
    q, scales, zeros, g_idx, _, loss, damp, _ = _task(host, qcfg).quantize()
    assert adapter.counters()["seams"]["quantize"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    assert torch.equal(q, want.weight) and torch.equal(scales, want.scales) and torch.equal(zeros, want.zeros)
    assert torch.equal(g_idx, torch.arange(256, dtype=torch.int32) // 32) and loss == want.loss


def test_installs_engine_options_reach_the_engine(host, engine_calls):
    """install(inverse="cholesky_inverse", tf32=False) (not the defaults) solves with those
    engine options: the same as calling the engine with them on the merged Hessian; an
    unknown inverse is refused."""
    import qlink.quant

    qcfg = host["config"].QuantizeConfig(group_size=32)
    adapter.install(ctx=host["ctx"], strict=True, inverse="cholesky_inverse", tf32=False)
    g = _task(host, qcfg)
    g.finalize_hessian()
    want = qlink.quant.gptq_quantize(g.module.weight.data, g.H.clone(), group_size=32, inverse="cholesky_inverse",
                                     tf32=False, damp=qcfg.damp_percent, nsamples=g.nsamples, ctx=host["ctx"])
    q, scales, zeros, _, _, loss, _, _ = _task(host, qcfg).quantize()
    assert adapter.counters()["seams"]["quantize"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    assert torch.equal(q, want.weight) and torch.equal(scales, want.scales) and loss == want.loss
    assert [(c["inverse"], c["tf32"]) for call in engine_calls for c in call] == [("cholesky_inverse", False)] * 2
    with pytest.raises(ValueError, match="inverse must be one of cholesky_inverse, triangular, got 'lu'"):
        adapter.install(ctx=host["ctx"], inverse="lu")
    with pytest.raises(ValueError, match="tf32 must be True or False, got 1"):
        adapter.install(ctx=host["ctx"], tf32=1)


@pytest.mark.parametrize("change, reason", [
    (dict(mse=2.4), "mse > 0 (a scale search per group)"),
    (dict(act_group_aware=True, static_groups=True), "act_group_aware with static_groups"),
    (dict(mock_quantization=True), "mock_quantization"),
    (dict(bits=5), "bits=5"),
    (dict(group_size=96), "group_size 96 does not divide the 256 columns"),
    (dict(fallback=1e9), "a fallback strategy for too few samples"),
])
def test_options_the_engine_does_not_cover_go_to_the_hosts_solve(host, engine_calls, change, reason):
    adapter.install(ctx=host["ctx"])
    qcfg = host["config"].QuantizeConfig(**change)
    g = _task(host, qcfg)
    if change.get("fallback"):
        with pytest.raises(NotImplementedError):  # the stand-in host has no fallback strategies
            g.quantize()
    else:
        g.quantize()
    assert engine_calls == []
    assert adapter.counters()["seams"]["quantize"]["reasons"] == {reason: 1}


def test_a_subclass_or_another_layer_type_keeps_its_own_solve(host):
    adapter.install(ctx=host["ctx"])

    class Tuned(host["gptq_processor"].GPTQ):  # qlink's task class, subclassed
        pass

    Tuned(torch.nn.Linear(128, 8)).quantizer.configure(perchannel=True)
    task = _task(host)
    task.__class__ = Tuned
    task.quantize()
    assert adapter.counters()["seams"]["quantize"]["reasons"] == {"a GPTQ subclass (Tuned) with its own solve": 1}


def test_a_failing_engine_falls_back_or_raises_when_strict(host, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    adapter.install(ctx=host["ctx"])
    twin = _task(host)  # the same partials, accumulated through qlink's add_batch
    monkeypatch.setattr(host["ctx"], "gptq_quantize", broken)
    got = _task(host).quantize()
    assert adapter.counters()["seams"]["quantize"] == {"qlink": 0, "host": 0, "fallback": 1,
                                                       "reasons": {"RuntimeError: injected": 1}}
    # The twin's Hessian too: fed before the first solve, it was merged for the same call.
    assert adapter.counters()["seams"]["materialize_global_hessian"]["qlink"] == 2
    adapter.uninstall()
    assert torch.equal(got[0], twin.quantize()[0])  # the host's solve, on the Hessian merged once
    adapter.install(ctx=host["ctx"], strict=True)
    with pytest.raises(FallbackRefused, match="quantize failed.*injected"):
        _task(host).quantize()


class _Quantizer(torch.nn.Module):
    """GPTQModel's Quantizer's buffers: host scalars until its first solve."""

    def __init__(self, device=None):
        super().__init__()
        self.register_buffer("maxq", torch.tensor(0, device=device))
        self.register_buffer("scale", torch.zeros(1, device=device))


class _Named:
    name = "model.layers.0.mlp.down_proj"


def _processor(quantizer):
    task = type("Task", (), {"quantizer": quantizer})()
    return type("Processor", (), {"tasks": {_Named.name: task}})()


def test_rehoming_a_task_moves_its_quantizer_through_qlink_first(host, monkeypatch):
    """(A target other than the quantizer's: meta, which the CPU can move to.)"""
    adapter.install(ctx=host["ctx"], strict=True)
    moved = []
    monkeypatch.setattr(host["ctx"], "move_module_to_device", lambda m, d: moved.append((m, d)))
    quantizer = _Quantizer()
    looper = host["module_looper"].ModuleLooper()
    looper._rehome_processor_task(_processor(quantizer), _Named(), torch.device("meta"))
    assert moved == [(quantizer, torch.device("meta"))]
    looper._rehome_processor_task(type("Processor", (), {"tasks": {}})(), _Named(), torch.device("cpu"))
    looper._rehome_processor_task(_processor(quantizer), _Named(), None)
    looper._rehome_processor_task(_processor(_Quantizer()), _Named(), torch.device("cpu"))
    assert moved == [(quantizer, torch.device("meta"))]
    assert adapter.counters()["seams"]["rehome_processor_task"] == {
        "qlink": 1, "host": 3, "fallback": 0,
        "reasons": {"no quantizer module": 1, "no device": 1, "already on the device": 1}}


def test_a_failing_rehome_leaves_the_move_to_gptqmodel_or_raises_when_strict(host, monkeypatch):
    def failing(module, device):
        raise RuntimeError("injected")
    monkeypatch.setattr(host["ctx"], "move_module_to_device", failing)
    looper = host["module_looper"].ModuleLooper()
    adapter.install(ctx=host["ctx"])
    looper._rehome_processor_task(_processor(_Quantizer()), _Named(), torch.device("meta"))
    assert adapter.counters()["seams"]["rehome_processor_task"]["fallback"] == 1
    adapter.install(ctx=host["ctx"], strict=True)
    with pytest.raises(FallbackRefused, match="rehome_processor_task"):
        looper._rehome_processor_task(_processor(_Quantizer()), _Named(), torch.device("meta"))


def test_the_layer_loop_makes_fixed_segments_where_the_process_asked_for_expandable_ones(host, monkeypatch):
    """GPTQModel asks PyTorch's CUDA allocator for expandable segments as it is imported; the
    loop runs with fixed ones (their growth inside the forwards' allocations left the GPU
    idle), expandable ones back after, also when the loop raises; fixed_segments=False
    leaves the allocator as set."""
    from qlink.integrations import process_settings
    settings, seen = [], []
    monkeypatch.setattr(process_settings, "_has_cuda", lambda: True)  # the allocator's part is mocked
    monkeypatch.setattr(process_settings, "_setter", lambda: settings.append)
    monkeypatch.setattr(process_settings, "_snapshot_settings", dict)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:256")

    def cache_inputs(calibration_data, **_):  # the loop's body, on the looper itself
        seen.append(list(settings))
        if calibration_data == "fail":
            raise RuntimeError("the loop failed")
        return calibration_data
    looper = host["module_looper"].ModuleLooper()
    looper.cache_inputs = cache_inputs
    adapter.install(ctx=host["ctx"])
    assert looper.loop("data") == "data"
    off, on = "expandable_segments:False,max_split_size_mb:256", "expandable_segments:True,max_split_size_mb:256"
    assert seen[-1] == [off]
    assert settings == [off, on]  # GPTQModel's other options kept (PyTorch resets those a string omits)
    with pytest.raises(RuntimeError, match="the loop failed"):
        looper.loop("fail")
    assert settings[-1] == on and len(settings) == 4
    assert adapter.counters()["seams"]["fixed_segments"]["qlink"] == 2

    adapter.install(ctx=host["ctx"], fixed_segments=False)
    looper.loop("data")
    assert len(settings) == 4
    assert adapter.counters()["seams"]["fixed_segments"]["reasons"] == {"fixed_segments=False": 1}
    for bad in (None, 0, "fixed"):
        with pytest.raises(ValueError, match="fixed_segments"):
            adapter.install(ctx=host["ctx"], fixed_segments=bad)


def test_the_layer_loop_runs_with_a_short_switch_interval_restored_after(host):
    """GPTQModel's loop holds the GIL-handover interval of install's switch_interval while
    it runs (its forwards' operators take the GIL back without waiting out the finalizers'
    Python), the interval before it restored after, also when the loop raises; by default
    the interval is left alone."""
    import sys
    seen = []

    def cache_inputs(calibration_data, **_):  # the loop's body, on the looper itself
        seen.append(sys.getswitchinterval())
        if calibration_data == "fail":
            raise RuntimeError("the loop failed")
        return calibration_data
    before = sys.getswitchinterval()
    looper = host["module_looper"].ModuleLooper()
    looper.cache_inputs = cache_inputs
    adapter.install(ctx=host["ctx"], switch_interval=1e-4)
    assert looper.loop("data") == "data"
    assert seen[-1] == pytest.approx(1e-4) and seen[-1] < before
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError, match="the loop failed"):
        looper.loop("fail")
    assert sys.getswitchinterval() == before
    assert adapter.counters()["seams"]["switch_interval"]["qlink"] == 2

    adapter.install(ctx=host["ctx"])
    looper.loop("data")
    assert seen[-1] == before
    assert adapter.counters()["seams"]["switch_interval"]["reasons"] == {"switch_interval=None": 1}
    for bad in (0, -1e-3, 2.0, "1e-4", True):
        with pytest.raises(ValueError, match="switch_interval"):
            adapter.install(ctx=host["ctx"], switch_interval=bad)
