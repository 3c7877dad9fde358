"""qlink.integrations.autoround against a stand-in shaped like AutoRound (tests/python/hosts)
on the CPU backend's virtual devices: the native loop at world 1 against AutoRound's own
loop (the same draws, losses and weights), its fallback and strict paths and refusals;
data-parallel block tuning against AutoRound's own serial loop at worlds 2 and 4, replicas
identical after every step, the plan's refusals and demotions, a failing replica named,
iters=0 layers spread over the devices."""
import random
import types

import pytest
import torch

import qlink
from qlink.integrations import autoround as adapter
from qlink.integrations.autoround.parallel_tuning import ReplicaFailed
from qlink.integrations.patches import FallbackRefused
from qlink.plan import PlanRefused

from stand_in_hosts import stand_in

HIDDEN, SEQ = 64, 6


@pytest.fixture
def host():
    with stand_in("auto_round", adapter):
        import auto_round
        from auto_round.algorithms import block_runner
        from auto_round.algorithms.quantization.rtn import quantizer as rtn
        from auto_round.algorithms.quantization.sign_round import quantizer as sign_round
        yield types.SimpleNamespace(auto_round=auto_round, block_runner=block_runner, rtn=rtn, sign_round=sign_round)


def cpu(library, devices):
    return qlink.load({"backend": "cpu", "cpu_devices": devices, "log_level": "off"}, library=library)


def scheme(linear, name):
    """AutoRound's W4A16 keys on a linear: it sets every key of its scheme on each layer it
    quantizes, None where unused."""
    linear.bits, linear.group_size, linear.global_name = 4, 32, name
    linear.data_type, linear.act_bits, linear.super_bits, linear.super_group_size = "int", 16, None, None


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = torch.nn.Linear(2 * HIDDEN, HIDDEN)
        for name, m in (("up", self.up), ("down", self.down)):
            scheme(m, "block." + name)

    def forward(self, hidden_states, scale=None, shift=None):
        out = self.down(torch.nn.functional.silu(self.up(hidden_states))) * scale
        return out if shift is None else out + shift


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()


def _setup(host, seed=0, nsamples=16, batch_size=4, layers=None, lr_for_bits=None, device="cpu", **config):
    model, inputs, others, outputs = _data(seed, nsamples)
    for name, options in (layers or {}).items():  # per-layer quantization options, as AutoRound sets them
        for key, value in options.items():
            setattr(getattr(model.block, name), key, value)
    if device != "cpu":  # where AutoRound has dispatched the block and cached its data
        model.to(device)
        inputs, outputs = [x.to(device) for x in inputs], [y.to(device) for y in outputs]
        others = {"scale": others["scale"].to(device), "shift": [t.to(device) for t in others["shift"]]}
    q = host.sign_round.SignRoundQuantizer(host.sign_round.SignRoundConfig(**config))
    if lr_for_bits:  # AutoRound's heuristic raises low-bit lrs at 1000 iterations and more: one at any count
        q._config.compute_lr = q._config.compute_minmax_lr = lr_for_bits
    q.model = model
    q.block_forward = host.block_runner.BlockForwardRunner(batch_size=batch_size, device=device, cache_device=device)
    q.calibration_context.batch_size = batch_size
    return model, q, inputs, others, outputs


def _data(seed, nsamples=16):
    """A model at its full-precision start, calibration inputs and the block's outputs."""
    torch.manual_seed(seed)
    model = Model()
    inputs = [torch.randn(1, SEQ, HIDDEN) for _ in range(nsamples)]
    # A value every sample shares, and one of each sample's own (AutoRound caches those as a list).
    others = {"scale": torch.tensor(1.5), "shift": [torch.randn(1, 1, HIDDEN) * 0.1 for _ in range(nsamples)]}
    with torch.no_grad():
        outputs = [model.block(x, scale=others["scale"], shift=shift) for x, shift in zip(inputs, others["shift"])]
    return model, inputs, others, outputs


def _token_ids(nsamples=16):
    """Calibration token ids as AutoRound caches them: -100 where the loss ignores a position
    (every sample's last; a padded tail on every third)."""
    gen = torch.Generator().manual_seed(5)
    ids = [torch.randint(3, 1000, (1, SEQ), generator=gen) for _ in range(nsamples)]
    for i, t in enumerate(ids):
        t[0, -1] = -100
        if i % 3 == 0:
            t[0, -3:] = -100
    return ids


def _tune(host, seed=0, token_ids=False, **config):
    """One block tuned from the same start and the same sampler draws: (model, best_params,
    the stand-in loop's losses or None). token_ids: AutoRound's, masking the loss."""
    model, q, inputs, others, outputs = _setup(host, seed, **config)
    random.seed(seed)  # AutoRound's sampler shuffles with `random`
    block_ctx = types.SimpleNamespace(block_name="block", block_index=0, block_cnt=2)
    best = q.quantize_block(model.block, inputs, others, outputs, None, block_ctx,
                            input_ids=_token_ids(len(inputs)) if token_ids else None)
    return model, best, getattr(q, "losses", None)


def _error(model, seed=0):
    """The tuned block's mean squared error against the full-precision block's outputs."""
    _, inputs, others, outputs = _data(seed)
    with torch.no_grad():
        return float(sum(((model.block(x, scale=others["scale"], shift=shift) - y) ** 2).mean()
                         for x, shift, y in zip(inputs, others["shift"], outputs)))


NATIVE_CASES = {
    "sym int4, a minmax lr of its own": dict(iters=30, minmax_lr=0.01),
    "asym, int8 per-channel down, bf16 scales": dict(iters=30, layers={
        "up": {"sym": False, "scale_dtype": torch.bfloat16}, "down": {"bits": 8, "group_size": -1, "sym": False}}),
    "2-bit up at its own lr, fp32 scales": dict(iters=20, layers={"up": {"bits": 2, "scale_dtype": torch.float32}},
                                                lr_for_bits=lambda bits: 0.08 if bits <= 3 else None),
    "not_use_best_mse": dict(iters=12, not_use_best_mse=True),
    "gradient_accumulate_steps=2": dict(iters=12, gradient_accumulate_steps=2),
    "a valid-token mask (AutoRound's always, with token ids)": dict(iters=30, token_ids=True),
    "a mask and gradient_accumulate_steps=2": dict(iters=12, token_ids=True, gradient_accumulate_steps=2),
}


@pytest.mark.parametrize("case", list(NATIVE_CASES))
def test_the_native_loop_at_world_1_equals_autorounds_own(host, library, case):
    """The same draws, every iteration's loss and the final weights: the engine's quant-
    dequant is AutoRound's bit for bit and its grad_v too; its range-factor gradients sum
    in another order (a few units in the last place), which no step's sign feels on this
    block: a flip would show here as weights and losses that part."""
    config = NATIVE_CASES[case]
    own, own_best, own_losses = _tune(host, **config)
    assert config.get("not_use_best_mse") or min(own_losses) < own_losses[0]  # the best is a tuned iteration
    own_draws = list(host.auto_round.compressors.utils.IndexSampler.drawn)
    host.auto_round.compressors.utils.IndexSampler.drawn.clear()
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    tuned, best, _ = _tune(host, **config)
    counters = adapter.counters()["seams"]
    assert counters["quantize_block"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    for patch in ("step_graph", "compiled_loss"):  # eager on the CPU, counted
        assert counters[patch]["reasons"] == {"not a CUDA device (cpu)": 1}, patch
    if config.get("gradient_accumulate_steps", 1) == 1:  # v stepped inside the backward
        assert counters["v_step"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    else:
        assert counters["v_step"]["reasons"] == {
            "2 sub-batches an iteration (gradient_accumulate_steps 2): v's gradients add up before the step": 1}
    assert host.auto_round.compressors.utils.IndexSampler.drawn == own_draws  # drawn up front, the same
    (name, losses), = adapter.losses()
    assert name == "block" and len(losses) == len(own_losses) == config["iters"]
    assert losses == own_losses  # AutoRound's float64 sums of fp32 losses, on the device
    assert set(best) == set(own_best) == {"up", "down"}
    for layer in best:
        assert set(best[layer]) == {"value", "min_scale", "max_scale"}
        for key, t in best[layer].items():
            assert t.device.type == "cpu" and torch.equal(t, own_best[layer][key]), (layer, key)
    for (n, a), b in zip(own.block.named_parameters(), tuned.block.parameters()):
        assert torch.equal(a, b), n
    assert not any(hasattr(m, "orig_layer") for m in tuned.modules())  # unwrapped by AutoRound's unwrapper


@pytest.mark.parametrize("reduction,masked", [("mean", True), ("sum", True), ("mean", False)])
def test_the_loss_the_gpu_compiles_is_autorounds(host, reduction, masked):
    """_masked_mse (compiled on a GPU) against AutoRound's _get_loss: the same loss and the
    same gradient of the block's outputs, bit for bit, with its valid-token mask or none."""
    from qlink.integrations.autoround.native_loop import _masked_mse
    gen = torch.Generator().manual_seed(4)
    pred = torch.randn(3, SEQ, HIDDEN, generator=gen).bfloat16().requires_grad_()
    ref = torch.randn(3, SEQ, HIDDEN, generator=gen).bfloat16()
    rows = [(torch.arange(SEQ) < SEQ - 1 - i).long()[None] for i in range(3)]  # AutoRound's (1, tokens) rows
    q = host.sign_round.SignRoundQuantizer(host.sign_round.SignRoundConfig(iters=1))
    own = q._get_loss(pred, ref, [0, 1, 2], torch.nn.MSELoss(reduction=reduction), "cpu", rows if masked else None)
    own_grad, = torch.autograd.grad(own, pred)
    loss = _masked_mse(pred, ref, torch.cat(rows).unsqueeze(-1) if masked else None, reduction)
    grad, = torch.autograd.grad(loss, pred)
    assert torch.equal(loss, own) and torch.equal(grad, own_grad)


def test_a_batch_selected_as_words_is_the_same_bytes():
    from qlink.integrations.autoround.native_loop import _as_words, _from_words
    rows = torch.randn(7, 5, 12).bfloat16()  # 120 bytes a sample: 15 words
    index = torch.tensor([6, 0, 3, 3])
    words = _as_words(rows, 0)
    assert words.dtype == torch.int64 and words.data_ptr() == rows.data_ptr()
    assert torch.equal(_from_words(torch.index_select(words, 0, index), rows), torch.index_select(rows, 0, index))
    assert _as_words(torch.randn(7, 5, 3).bfloat16(), 0) is None  # 30 bytes a sample
    assert _as_words(rows.transpose(1, 2), 0) is None and _as_words(rows, 1) is None


def test_the_native_loop_selects_batches_on_the_device(host, library, monkeypatch):
    """Every batch an index_select of device tensors: no per-sample list reaches AutoRound's
    select_batch (indexing one from the host synchronizes a GPU and defeats its graph)."""
    seen = []
    select = host.block_runner.BlockForwardRunner.select_batch

    def recording(self, inputs, input_others, indices):
        seen.append((type(inputs), isinstance(indices, torch.Tensor),
                     sorted(k for k, v in input_others.items() if isinstance(v, list))))
        return select(self, inputs, input_others, indices)

    monkeypatch.setattr(host.block_runner.BlockForwardRunner, "select_batch", recording)
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    _tune(host, iters=4)
    assert seen == [(torch.Tensor, True, [])] * 4


def test_a_failure_mid_block_runs_autorounds_loop_on_the_untouched_block_or_raises_when_strict(host, library,
                                                                                               monkeypatch):
    """AutoRound's loop then draws the batches it draws alone (the sampler's `random` state
    restored) and tunes to the same weights (its best iteration is not the first here)."""
    own, _, own_losses = _tune(host, iters=30)
    assert min(own_losses) < own_losses[0]
    drawn = host.auto_round.compressors.utils.IndexSampler.drawn
    own_draws = list(drawn)
    ctx = cpu(library, 1)
    step, calls = ctx.signsgd_step, []

    def failing_tenth_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 10:
            raise RuntimeError("injected at step 10")
        return step(*args, **kwargs)

    monkeypatch.setattr(ctx, "signsgd_step", failing_tenth_step)
    adapter.install("auto", ctx=ctx)
    drawn.clear()
    fallen_back, _, _ = _tune(host, iters=30)
    assert drawn[30:] == own_draws  # after the native loop's own 30 draws, AutoRound's, the same
    assert all(torch.equal(a, b) for a, b in zip(own.block.parameters(), fallen_back.block.parameters()))
    assert adapter.counters()["seams"]["quantize_block"] == {"qlink": 0, "host": 0, "fallback": 1,
                                                             "reasons": {"RuntimeError: injected at step 10": 1}}
    calls.clear()
    adapter.install("auto", ctx=ctx, strict=True)
    model, q, inputs, others, outputs = _setup(host, iters=30)
    start = [p.detach().clone() for p in model.block.parameters()]
    with pytest.raises(FallbackRefused, match="quantize_block failed and strict=True.*injected at step 10"):
        q.quantize_block(model.block, inputs, others, outputs, None, types.SimpleNamespace(block_name="block"))
    assert all(torch.equal(a, b) for a, b in zip(start, model.block.parameters()))  # as AutoRound left them
    assert not any(hasattr(m, "orig_layer") for m in model.modules())


@pytest.mark.parametrize("layers,message", [
    ({"up": {"bits": 5}}, "layer 'up': bits = 5 is not one of 2, 3, 4, 8"),
    ({"down": {"group_size": 48}}, "layer 'down': group_size 48 does not divide the weight's 128 columns"),
    ({"up": {"scale_dtype": torch.int8}}, "layer 'up': scale_dtype torch.int8 is not float16, bfloat16 or float32"),
    ({"down": {"weight": torch.nn.Parameter(torch.zeros(HIDDEN, 2 * HIDDEN, dtype=torch.float64))}},
     "layer 'down': weight has dtype torch.float64, expected float16, bfloat16 or float32"),
    ({}, "layer 'up': weight is on cpu, not the tuning device cpu:1"),
])
def test_bad_layers_are_refused_before_anything_is_written(host, library, monkeypatch, layers, message):
    if not layers:  # AutoRound tunes on another device than the block's
        monkeypatch.setattr(host.auto_round.utils.device_manager.device_manager, "device", torch.device("cpu", 1))
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    model, q, inputs, others, outputs = _setup(host, iters=4, layers=layers)
    start = {n: p.detach().clone() for n, p in model.block.named_parameters()}
    with pytest.raises(FallbackRefused) as refused:
        q.quantize_block(model.block, inputs, others, outputs, None, types.SimpleNamespace(block_name="block"))
    assert "InvalidLayer: " + message in str(refused.value)
    assert all(torch.equal(start[n], p) for n, p in model.block.named_parameters())
    assert not any(hasattr(m, "orig_layer") for m in model.modules())


def test_options_the_native_loop_does_not_cover_run_autorounds_own_and_say_why(host, library):
    own, _, _ = _tune(host, iters=5, momentum=0.9)
    adapter.install("auto", ctx=cpu(library, 1), strict=True)  # by design, not a failure: strict lets it run
    same, _, _ = _tune(host, iters=5, momentum=0.9)
    _tune(host, iters=5, dynamic_max_gap=2)
    assert all(torch.equal(a, b) for a, b in zip(own.block.parameters(), same.block.parameters()))
    assert adapter.counters()["seams"]["quantize_block"]["reasons"] == {
        "an optimizer other than pure SignSGD (momentum 0.9)": 1, "dynamic_max_gap (an early stop the host decides)": 1}
    assert adapter.losses() == []


def test_off_runs_autorounds_own_loop(host, library):
    own, _, _ = _tune(host, iters=5)
    adapter.install("off", ctx=cpu(library, 1))
    same, _, _ = _tune(host, iters=5)
    assert all(torch.equal(a, b) for a, b in zip(own.block.parameters(), same.block.parameters()))
    assert adapter.counters()["seams"]["quantize_block"]["reasons"] == {"parallel_quantization=off": 1}


@pytest.mark.parametrize("world", [2, 4])
def test_data_parallel_tuning_tracks_autorounds_serial_loop(host, library, world, monkeypatch):
    """The same batches from the same start: the summed gradients are the serial ones up to
    rounding. For 5 steps no sign differs, the tuned blocks are the serial one; over 30
    steps signs of near-zero sums part the paths, the tuned block no worse than serial's.
    Pure SignSGD steps on qlink's engine, never AutoRound's optimizer."""
    own_step = host.sign_round.SignRoundQuantizer._step
    for iters, same in ((5, True), (30, False)):
        adapter.uninstall()
        serial, _, _ = _tune(host, iters=iters)
        adapter.install(world, ctx=cpu(library, 4), check_replicas=True)  # every step: replicas == home
        monkeypatch.setattr(host.sign_round.SignRoundQuantizer, "_step", None)
        tuned, best, _ = _tune(host, iters=iters)
        monkeypatch.setattr(host.sign_round.SignRoundQuantizer, "_step", own_step)
        assert adapter.counters()["seams"]["quantize_block"]["qlink"] == 1
        name, plan = adapter.plans()[0]
        assert name == "block" and plan.devices == tuple(range(world))
        assert set(best) == {"up", "down"} and set(best["up"]) == {"value", "min_scale", "max_scale"}
        if same:
            assert all(torch.equal(a, b) for a, b in zip(serial.block.parameters(), tuned.block.parameters()))
        assert _error(tuned) / _error(serial) < 1.02


def test_a_momentum_optimizer_exchanges_summed_gradients(host, library):
    adapter.install(2, ctx=cpu(library, 2), check_replicas=True)
    serial_config = dict(iters=10, momentum=0.9)
    tuned, _, _ = _tune(host, **serial_config)
    adapter.uninstall()
    serial, _, _ = _tune(host, **serial_config)
    assert abs(_error(tuned) / _error(serial) - 1) < 0.02


def test_auto_on_one_device_runs_the_native_loop_and_says_why(host, library, caplog):
    adapter.install("auto", ctx=cpu(library, 1))
    with caplog.at_level("WARNING", logger="qlink"):
        _tune(host, iters=5)
        _tune(host, iters=5)
    assert adapter.counters()["seams"]["quantize_block"]["qlink"] == 2
    assert [r.getMessage() for r in caplog.records] == [
        "qlink: parallel_quantization=auto runs on one device: only 1 device visible: serial"]  # once per reason


def test_an_explicit_world_that_cannot_engage_raises_naming_every_reason(host, library):
    adapter.install(3, ctx=cpu(library, 2))
    with pytest.raises(PlanRefused) as refused:
        _tune(host, iters=5)
    assert refused.value.reasons == ["3 replicas asked, 2 devices visible",
                                     "tuning (iters=5) needs a power-of-two world for halving-doubling, got 3"]


def test_a_batch_smaller_than_the_world_demotes_it(host, library):
    adapter.install(4, ctx=cpu(library, 4))
    _tune(host, iters=3, batch_size=2)
    (_, plan), = adapter.plans()
    assert plan.devices == (0, 1)
    assert plan.left_out == tuple("device %d: batch_size 2 < 4 replicas, demoted to 2 (every replica needs a sample)"
                                  % d for d in (2, 3))


def test_an_error_on_a_replica_names_the_replica(host, library, monkeypatch):
    adapter.install(2, ctx=cpu(library, 2))
    forward = host.block_runner.BlockForwardRunner.forward
    homes = []

    def failing_on_replicas(self, block, *args, **kwargs):
        if homes and block is not homes[0]:
            raise RuntimeError("injected")
        return forward(self, block, *args, **kwargs)

    model, q, inputs, others, outputs = _setup(host, iters=3)
    homes.append(model.block)
    monkeypatch.setattr(host.block_runner.BlockForwardRunner, "forward", failing_on_replicas)
    with pytest.raises(ReplicaFailed, match=r"replica 1 \(qlink device 1\) failed during iteration 0: "
                                            r"RuntimeError: injected"):
        q.quantize_block(model.block, inputs, others, outputs, None, types.SimpleNamespace(block_name="block"))


def test_replicas_qlink_fails_to_make_fall_back_to_autorounds_loop_or_raise_when_strict(host, library, monkeypatch):
    """The mirrors are the one qlink step before AutoRound's state changes: if they fail,
    AutoRound's serial loop tunes the untouched block (counted, with the reason); strict
    refuses instead."""
    serial, _, _ = _tune(host, iters=5)
    ctx = cpu(library, 2)

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(ctx, "mirror_module", broken)
    adapter.install(2, ctx=ctx)
    fallen_back, _, _ = _tune(host, iters=5)
    assert all(torch.equal(a, b) for a, b in zip(serial.block.parameters(), fallen_back.block.parameters()))
    assert adapter.counters()["seams"]["quantize_block"] == {"qlink": 0, "host": 0, "fallback": 1,
                                                             "reasons": {"RuntimeError: injected": 1}}
    adapter.install(2, strict=True, ctx=ctx)
    with pytest.raises(FallbackRefused, match="quantize_block failed and strict=True.*injected"):
        _tune(host, iters=5)


def test_settings_that_are_not_ones_are_refused_naming_them(host, library):
    with pytest.raises(ValueError, match="parallel_quantization must be 'off', 'auto' or an int, got 'on'"):
        adapter.install("on", ctx=cpu(library, 2))
    with pytest.raises(ValueError, match="transport must be one of"):
        adapter.install(2, ctx=cpu(library, 2), transport="fp16")


def test_uninstall_restores_autorounds_methods(host, library):
    from auto_round.compressors.orchestrator import CompressionOrchestrator

    def methods():
        return [host.sign_round.SignRoundQuantizer.quantize_block, host.rtn.RTNQuantizer.quantize_block,
                host.rtn.OptimizedRTNQuantizer.quantize_block, CompressionOrchestrator.quantize]
    originals = methods()
    adapter.install(2, ctx=cpu(library, 2))
    assert all(a is not b for a, b in zip(methods(), originals))
    adapter.uninstall()
    assert methods() == originals


def test_a_run_collects_only_what_it_made_and_unfreezes_after(host, library):
    """AutoRound's gc.collect() between blocks walks only the objects made during quantize():
    those older are frozen for the call, unfrozen after it returns or raises (objects frozen
    before it too: left frozen, their cycles could never be collected); garbage the run makes
    is still collected; with the collector disabled nothing changes, and that is said."""
    import gc
    import weakref
    from auto_round.compressors.orchestrator import CompressionOrchestrator
    adapter.install("auto", ctx=cpu(library, 1))
    made = []

    def work():  # a cycle made during the run, holding a tensor: the host's clearing frees it
        cycle = [torch.zeros(4)]
        cycle.append(cycle)
        made.append(weakref.ref(cycle[0]))
    gc.freeze()  # objects frozen before the run (torch may freeze some)
    run = CompressionOrchestrator(work).quantize()
    assert run.freeze_counts[0] > 1000  # every object older than the call (the test process's)
    assert made[0]() is None
    assert gc.get_freeze_count() == 0
    assert adapter.counters()["seams"]["frozen_gc"]["qlink"] == 1

    def fail():
        raise RuntimeError("a block failed")
    with pytest.raises(RuntimeError, match="a block failed"):
        CompressionOrchestrator(fail).quantize()
    assert gc.get_freeze_count() == 0

    gc.disable()
    try:
        assert CompressionOrchestrator().quantize().freeze_counts == [0]
        assert adapter.counters()["seams"]["frozen_gc"]["reasons"] == {"the collector is disabled": 1}
    finally:
        gc.enable()


def _rtn(host, cls):
    torch.manual_seed(3)
    model = Model()
    for m in (model.block.up, model.block.down):
        m.imatrix, m.imatrix_cnt = torch.rand(m.in_features) * 4, 2
    q = cls(None)
    q.model = model
    q.quantize_block(model.block, None, {}, None, None, types.SimpleNamespace(block_name="block"))
    return model


@pytest.mark.parametrize("name", ["RTNQuantizer", "OptimizedRTNQuantizer"])
def test_iters_0_spreads_the_blocks_layers_over_the_devices(host, library, name):
    serial = _rtn(host, getattr(host.rtn, name))
    adapter.install("auto", ctx=cpu(library, 2))
    spread = _rtn(host, getattr(host.rtn, name))
    assert adapter.counters()["seams"]["rtn_layers"]["qlink"] == 1
    assert adapter.plans()[0][1].devices == (0, 1)  # at iters=0 every device, no power of two needed
    for a, b in zip(serial.block.parameters(), spread.block.parameters()):
        assert torch.equal(a, b)
    assert not any(hasattr(m, "tuning_device") for m in spread.modules())


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() != 1, reason="needs exactly one GPU")
def test_the_native_loop_on_a_gpu_replays_a_graph_without_host_synchronization(host, ctx, monkeypatch):
    """On one GPU: the iteration captured and replayed as a CUDA graph, the loss compiled
    before the loop, no synchronizing call in any iteration (PyTorch's sync debug mode raises
    on one), and the tuning AutoRound's own (the same draws, the first losses, the final
    error within 1 %)."""
    from qlink.integrations.autoround import native_loop
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(host.auto_round.utils.device_manager.device_manager, "device", gpu)
    own, _, own_losses = _tune(host, iters=30, token_ids=True, device=gpu)
    drawn = host.auto_round.compressors.utils.IndexSampler.drawn
    own_draws = list(drawn)
    drawn.clear()
    iteration = native_loop.NativeTuning.iteration

    def unsynchronized(self):
        torch.cuda.set_sync_debug_mode("error")
        try:
            iteration(self)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(native_loop.NativeTuning, "iteration", unsynchronized)
    adapter.install("auto", ctx=ctx, strict=True)
    tuned, _, _ = _tune(host, iters=30, token_ids=True, device=gpu)
    for patch in ("step_graph", "compiled_loss"):
        assert adapter.counters()["seams"][patch] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}, patch
    assert drawn == own_draws
    (_, losses), = adapter.losses()
    assert losses[:3] == pytest.approx(own_losses[:3], rel=1e-5)
    assert abs(_error(tuned.cpu()) / _error(own.cpu()) - 1) < 0.01


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() != 1, reason="needs exactly one GPU")
def test_a_loop_that_fails_leaves_the_callers_stream_behind_its_queued_work(host, ctx, monkeypatch):
    """An iteration that raises with work still queued on the loop's stream: the caller's
    stream waits for that work, so nothing after the failure (AutoRound's own loop, in the
    memory the attempt freed) runs on it before the loop's writes are done."""
    from qlink.integrations.autoround import native_loop
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(host.auto_round.utils.device_manager.device_manager, "device", gpu)
    iteration, calls = native_loop.NativeTuning.iteration, []

    def failing(self):
        calls.append(self)
        iteration(self)
        if len(calls) == 2:
            torch.cuda._sleep(200_000_000)  # still queued on the loop's stream when it raises
            raise RuntimeError("injected")
    monkeypatch.setattr(native_loop.NativeTuning, "iteration", failing)
    adapter.install("auto", ctx=ctx, strict=True)
    with pytest.raises(FallbackRefused, match="injected"):
        _tune(host, iters=30, token_ids=True, device=gpu)
    assert not torch.cuda.current_stream(gpu).query()  # behind the loop's sleep
    torch.cuda.synchronize()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() != 1, reason="needs exactly one GPU")
def test_the_graph_is_captured_with_the_warm_up_still_queued(host, ctx, monkeypatch):
    """The capture neither synchronizes the device nor empties the allocator's cache (as
    torch.cuda.graph does first, draining the GPU of the warm-up iterations still queued), and
    its graph replays (the tuning it replays: the test above)."""
    from qlink.integrations.autoround import native_loop
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(host.auto_round.utils.device_manager.device_manager, "device", gpu)
    capturing, drained = [], []
    for name in ("synchronize", "empty_cache"):
        def recording(*args, _name=name, _original=getattr(torch.cuda, name), **kwargs):
            if capturing:
                drained.append(_name)
            return _original(*args, **kwargs)
        monkeypatch.setattr(torch.cuda, name, recording)
    capture = native_loop.NativeTuning._capture

    def watched(self, stream):
        capturing.append(stream)
        try:
            return capture(self, stream)
        finally:
            capturing.clear()

    monkeypatch.setattr(native_loop.NativeTuning, "_capture", watched)
    adapter.install("auto", ctx=ctx, strict=True)
    _tune(host, iters=30, token_ids=True, device=gpu)
    assert adapter.counters()["seams"]["step_graph"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    assert drained == []


def _cached_inputs(nsamples=6):
    """A block's inputs as AutoRound's capture leaves them in CPU memory: a list of one-sample
    hidden states, per-sample lists of the others, a shared tensor and a flag."""
    gen = torch.Generator().manual_seed(5)
    return {"input_ids": [torch.randn(1, SEQ, HIDDEN, generator=gen) for _ in range(nsamples)],
            "position_embeddings": [(torch.randn(1, SEQ, 8, generator=gen), torch.randn(1, SEQ, 8, generator=gen))
                                    for _ in range(nsamples)],
            "attention_mask": [torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool)], "use_cache": False}


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.device == b.device and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _preprocess(cache_device):
    from auto_round.calibration.inputs import preprocess_block_inputs
    return preprocess_block_inputs(_cached_inputs(), compress_context=types.SimpleNamespace(cache_device=cache_device))


def test_block_inputs_for_the_host_are_autorounds_own_move(host, library):
    own = _preprocess(torch.device("cpu"))
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    assert _same(_preprocess(torch.device("cpu")), own)
    assert adapter.counters()["seams"]["block_inputs"] == {"qlink": 0, "host": 2, "fallback": 0, "reasons": {
        "not a GPU of a GPU backend (cpu, cpu)": 2}}
    from auto_round.calibration import inputs
    original = inputs.to_device
    adapter.uninstall()
    assert inputs.to_device is not original and inputs.to_device is host.auto_round.utils.to_device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_blocks_host_inputs_reach_the_gpu_through_qlinks_moves(host, ctx, monkeypatch):
    """AutoRound's preprocessing of a block's host inputs: the same tensors on the GPU as its
    own to_device makes, the samples in one allocation, the large move streamed through the
    staging's slots, the others dict updated in place; a failing move falls back to
    AutoRound's, or raises under strict."""
    from qlink import pinned_staging
    gpu = torch.device("cuda", 0)
    own = _preprocess(gpu)
    monkeypatch.setattr(pinned_staging, "STREAM_MIN_BYTES", 4096)
    adapter.install("auto", ctx=ctx, strict=True)
    from auto_round.calibration import inputs
    cached = _cached_inputs()
    others = {k: v for k, v in cached.items() if k != "input_ids"}
    moved_ids, moved_others = inputs.to_device(cached["input_ids"], gpu), inputs.to_device(others, gpu)
    assert moved_others is others
    assert _same(moved_ids, own[0]) and _same(_preprocess(gpu), own)
    assert len({t.untyped_storage().data_ptr() for t in moved_ids}) == 1  # the samples in one allocation
    assert adapter.counters()["seams"]["block_inputs"]["qlink"] == 4
    assert ctx.pinned_staging.counters()["streamed"] > 0

    def broken(*args, **kwargs):
        raise RuntimeError("injected")
    monkeypatch.setattr(ctx, "move_nested_to_device", broken)
    monkeypatch.setattr(ctx.pinned_staging, "to_device", broken)
    with pytest.raises(FallbackRefused, match="block_inputs failed.*injected"):
        _preprocess(gpu)
    adapter.install("auto", ctx=ctx)
    assert _same(_preprocess(gpu), own) and adapter.counters()["seams"]["block_inputs"]["fallback"] == 2


def test_a_block_on_the_host_is_dispatched_by_autorounds_own_move(host, library):
    q = host.sign_round.SignRoundQuantizer(host.sign_round.SignRoundConfig(iters=1))
    rtn = host.rtn.OptimizedRTNQuantizer(None)  # iters=0: BaseQuantizer's dispatch
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    block = Block()
    assert q.dispatch_block(block, None, {}) is block and q._loss_device == torch.device("cpu")
    assert rtn.dispatch_block(block, None, {}) is block
    assert adapter.counters()["seams"]["block_dispatch"]["reasons"] == {"not a GPU of a GPU backend (cpu, cpu)": 2}
    adapter.uninstall()
    assert host.sign_round.SignRoundQuantizer.dispatch_block.__module__ == host.sign_round.__name__
    assert host.rtn.BaseQuantizer.dispatch_block.__module__ == host.rtn.BaseQuantizer.__module__


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_block_reaches_the_gpu_through_qlinks_moves(host, ctx, monkeypatch):
    """dispatch_block on one GPU, SignRound's and the RTN quantizers' (BaseQuantizer's): the
    block's parameters on the GPU with the same values and identities as Module.to leaves
    them, SignRound's loss device set as AutoRound sets it; a failing move falls back to
    AutoRound's, or raises under strict."""
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(host.auto_round.utils.device_manager.device_manager, "device", gpu)
    monkeypatch.setattr(host.auto_round.utils.device_manager.device_manager, "device_list", [gpu])
    q = host.sign_round.SignRoundQuantizer(host.sign_round.SignRoundConfig(iters=1))
    adapter.install("auto", ctx=ctx, strict=True)
    block = Block()
    want, params = [p.detach().clone() for p in block.parameters()], list(block.parameters())
    assert q.dispatch_block(block, None, {}) is block
    assert list(block.parameters()) == params
    assert all(p.device == gpu and torch.equal(p.cpu(), w) for p, w in zip(block.parameters(), want))
    assert q._loss_device == gpu and q._card_0_in_high_risk is False
    assert adapter.counters()["seams"]["block_dispatch"]["qlink"] == 1

    rtn = host.rtn.RTNQuantizer(None)  # iters=0: BaseQuantizer's dispatch, through qlink's moves too
    block = Block()
    want, params = [p.detach().clone() for p in block.parameters()], list(block.parameters())
    assert rtn.dispatch_block(block, None, {}) is block and list(block.parameters()) == params
    assert all(p.device == gpu and torch.equal(p.cpu(), w) for p, w in zip(block.parameters(), want))
    assert adapter.counters()["seams"]["block_dispatch"]["qlink"] == 2

    def broken(*args, **kwargs):
        raise RuntimeError("injected")
    monkeypatch.setattr(ctx, "move_module_to_device", broken)
    with pytest.raises(FallbackRefused, match="block_dispatch failed.*injected"):
        q.dispatch_block(Block(), None, {})
    adapter.install("auto", ctx=ctx)
    moved = q.dispatch_block(Block(), None, {})
    assert all(p.device == gpu for p in moved.parameters())
    moved = rtn.dispatch_block(Block(), None, {})
    assert all(p.device == gpu for p in moved.parameters())
    assert adapter.counters()["seams"]["block_dispatch"]["fallback"] == 2


def test_a_module_leaves_the_gpu_through_qlink_unless_it_holds_meta_tensors_or_names_its_device(host, library):
    """mv_module_from_gpu, as AutoRound's orchestrator imported it: a plain module through
    qlink's moves (its parameters the same objects), one holding meta tensors, naming its
    own device or holding a module of its own move by AutoRound's own move (whose walk over
    the children comes back through qlink's), each reason counted; uninstalled, AutoRound's
    again."""
    from auto_round.compressors import orchestrator
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    block = Block()
    params = list(block.parameters())
    assert orchestrator.mv_module_from_gpu(block) is block and list(block.parameters()) == params
    lazy = Block()
    lazy.down.weight = torch.nn.Parameter(torch.empty(lazy.down.weight.shape, device="meta"))
    assert orchestrator.mv_module_from_gpu(lazy) is lazy and lazy.down.weight.is_meta
    named = Block()
    named.device = torch.device("cpu")
    assert orchestrator.mv_module_from_gpu(named) is named

    class OwnMove(torch.nn.Linear):
        def _apply(self, fn, *args, **kwargs):
            return super()._apply(fn, *args, **kwargs)
    own = torch.nn.Sequential(OwnMove(4, 4))
    assert orchestrator.mv_module_from_gpu(own) is own
    counted = adapter.counters()["seams"]["module_from_gpu"]  # AutoRound's own move recurses by its name:
    assert counted["qlink"] == 2 and counted["reasons"] == {  # lazy.up through qlink, lazy.down AutoRound's
        "meta tensors (AutoRound moves the others one by one)": 2, "a module that names its own device": 1,
        "a module of its own move (OwnMove: to or _apply)": 1}
    adapter.uninstall()
    assert orchestrator.mv_module_from_gpu is host.auto_round.utils.model.mv_module_from_gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_quantized_block_streams_back_to_pageable_memory(host, ctx, monkeypatch):
    """mv_module_from_gpu of a block on the GPU: its parameters on the CPU in pageable memory,
    the same objects with the values the GPU's queued work left (behind a sleep on the
    stream), streamed back through the staging's slots (a 64 MiB weight: four slots' turns);
    a failing move falls back to AutoRound's, or raises under strict."""
    from auto_round.compressors import orchestrator
    from qlink.integrations.patches import FallbackRefused
    adapter.install("auto", ctx=ctx, strict=True)
    block = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.LayerNorm(4096)).cuda()
    params = list(block.parameters())
    want = [p.detach().cpu() for p in params]
    want[0] = want[0] * 3
    torch.cuda._sleep(50_000_000)  # the copies wait behind this on the stream
    with torch.no_grad():
        block[0].weight.mul_(3)  # queued after the sleep: read too early, the copies are stale
    before = ctx.pinned_staging.counters()["streamed_back"]
    assert orchestrator.mv_module_from_gpu(block) is block and list(block.parameters()) == params
    assert all(p.device.type == "cpu" and not p.is_pinned() and torch.equal(p.detach(), w)
               for p, w in zip(params, want))
    assert ctx.pinned_staging.counters()["streamed_back"] - before == 4
    assert adapter.counters()["seams"]["module_from_gpu"]["qlink"] == 1

    def broken(*args, **kwargs):
        raise RuntimeError("injected")
    monkeypatch.setattr(ctx, "move_module_to_device", broken)
    with pytest.raises(FallbackRefused, match="module_from_gpu failed.*injected"):
        orchestrator.mv_module_from_gpu(block.cuda())
    adapter.install("auto", ctx=ctx)
    assert all(p.device.type == "cpu" for p in orchestrator.mv_module_from_gpu(block.cuda()).parameters())
    assert adapter.counters()["seams"]["module_from_gpu"]["fallback"] == 1


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() != 1, reason="needs exactly one GPU")
def test_an_iteration_that_reads_the_device_from_the_host_is_not_captured(host, ctx, monkeypatch):
    """An iteration that waits on the device (as AutoRound's own MoE routing does, a
    nonzero per expert) runs eagerly throughout, the reason counted, and the tuning is
    AutoRound's own (the first losses, the final error within 1 %)."""
    from qlink.integrations.autoround import native_loop
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(host.auto_round.utils.device_manager.device_manager, "device", gpu)
    own, _, own_losses = _tune(host, iters=30, token_ids=True, device=gpu)
    iteration, captures = native_loop.NativeTuning.iteration, []

    def reading(self):
        iteration(self)
        self.epoch.item()  # a host read of the device, as nonzero makes one

    monkeypatch.setattr(native_loop.NativeTuning, "iteration", reading)
    monkeypatch.setattr(native_loop.NativeTuning, "_capture", lambda self, stream: captures.append(1))
    adapter.install("auto", ctx=ctx, strict=True)
    tuned, _, _ = _tune(host, iters=30, token_ids=True, device=gpu)
    assert captures == [] and torch.cuda.get_sync_debug_mode() == 0
    assert adapter.counters()["seams"]["step_graph"]["reasons"] == {
        "the iteration reads the device from the host (called a synchronizing CUDA operation)": 1}
    (_, losses), = adapter.losses()
    assert losses[:3] == pytest.approx(own_losses[:3], rel=1e-5)
    assert abs(_error(tuned.cpu()) / _error(own.cpu()) - 1) < 0.01


def test_turning_the_sync_debug_mode_on_is_no_host_read(monkeypatch):
    """PyTorch warns once a process as the sync debug mode turns on; only a synchronizing
    call's warning counts as the iteration reading the device (the first block's graph was
    refused on the H200 for the former)."""
    import warnings
    from qlink.integrations.autoround import native_loop
    mode = [0]

    def set_mode(value):
        if value == "warn" and not mode[0]:
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations (Triggered internally at CUDAContext.cpp)")
        mode[0] = value
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode[0])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    with native_loop._host_reads() as reads:
        pass
    assert reads == [] and mode[0] == 0
    with native_loop._host_reads() as reads:
        warnings.warn("called a synchronizing CUDA operation (Triggered internally at CUDAFunctions.cpp)")
    assert reads == ["called a synchronizing CUDA operation"]
