"""The native loop on an MoE block on the AutoRound stand-in (CPU backend): each projection's
experts tuned together through the experts calls (ABI 1.10), against AutoRound's own loop,
which wraps and steps every expert on its own and never calls an expert its router gave no
tokens; and the whole block's fallback to layer-by-layer calls, with its reason."""
import random
import types

import pytest
import torch

from qlink.integrations import autoround as adapter
from qlink.integrations import grouped_experts
from qlink.integrations.autoround import grouped_unwrap, native_loop

from test_integration_autoround import HIDDEN, SEQ, cpu, host, scheme  # noqa: F401 (host: the stand-in's fixture)
from test_integration_autoround_grouped_moe import _grouped_mm_by_loop

EXPERTS = 4


@pytest.fixture(autouse=True)
def stacking_on_the_cpu(monkeypatch):
    """The CPU stands in for a GPU, where the commit's stacked unwraps pay."""
    monkeypatch.setattr(grouped_unwrap, "worth_stacking", lambda device: True)


class Expert(torch.nn.Module):
    def __init__(self, index):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = torch.nn.Linear(2 * HIDDEN, HIDDEN)
        for name, m in (("up", self.up), ("down", self.down)):
            scheme(m, "block.experts.%d.%s" % (index, name))

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


class MoeBlock(torch.nn.Module):
    """Top-1 routing as HF's sparse MoE blocks run it: only experts with tokens are called.
    The router (not quantized) never picks the last expert and seldom the one before it,
    which many batches leave without tokens."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, EXPERTS)
        with torch.no_grad():
            self.gate.bias[-1] = -100.0
            self.gate.bias[-2] = -1.5
        self.experts = torch.nn.ModuleList(Expert(i) for i in range(EXPERTS))

    def forward(self, hidden_states, scale=None, shift=None):
        flat = hidden_states.reshape(-1, HIDDEN)
        logits = self.gate(flat)
        top = logits.argmax(-1)
        weight = torch.softmax(logits, -1).gather(1, top[:, None])
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            idx = (top == e).nonzero().squeeze(-1)
            if idx.numel() == 0:
                continue
            out = out.index_add(0, idx, expert(flat[idx]) * weight[idx])
        out = out.reshape(hidden_states.shape) * scale
        return out if shift is None else out + shift


class InterfaceBlock(torch.nn.Module):
    """A Qwen3-MoE block as AutoRound 0.15 tunes it: a top-2 router, then transformers 5's
    experts interface (the stand-in's LinearLoopExperts: the linear_loop function its
    mapping holds, gate, up and down linears without bias, transformers' default gate)."""

    def __init__(self):
        super().__init__()
        from auto_round.modeling.fused_moe import moe_experts_interface
        self.gate = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = moe_experts_interface.LinearLoopExperts(HIDDEN, HIDDEN, EXPERTS)
        for e in range(EXPERTS):
            for name in ("gate_proj", "up_proj", "down_proj"):
                scheme(getattr(getattr(self.experts, str(e)), name), "block.experts.%d.%s" % (e, name))

    def forward(self, hidden_states, scale=None, shift=None):
        flat = hidden_states.reshape(-1, HIDDEN)
        weights, chosen = torch.topk(torch.softmax(self.gate(flat), -1), 2)
        out = self.experts(flat, chosen, weights / weights.sum(-1, keepdim=True)).reshape(hidden_states.shape) * scale
        return out if shift is None else out + shift


class Model(torch.nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block()


def _tune(host, seed=0, layers=None, block=MoeBlock, device="cpu", dtype=torch.float32, **config):  # noqa: F811
    """The MoE block tuned from one start and AutoRound's draws on `device` in `dtype`:
    (model, best_params, the stand-in loop's losses or None)."""
    torch.manual_seed(seed)
    model = Model(block)
    for name, options in (layers or {}).items():
        for key, value in options.items():
            setattr(model.block.get_submodule(name), key, value)
    nsamples, batch_size = 16, 4
    inputs = [torch.randn(1, SEQ, HIDDEN) for _ in range(nsamples)]
    others = {"scale": torch.tensor(1.5), "shift": [torch.randn(1, 1, HIDDEN) * 0.1 for _ in range(nsamples)]}
    if device != "cpu" or dtype != torch.float32:  # where AutoRound has dispatched the block and cached its data
        model.to(device, dtype)
        inputs = [x.to(device, dtype) for x in inputs]
        others = {"scale": others["scale"].to(device, dtype), "shift": [t.to(device, dtype) for t in others["shift"]]}
    with torch.no_grad():
        outputs = [model.block(x, scale=others["scale"], shift=s) for x, s in zip(inputs, others["shift"])]
    q = host.sign_round.SignRoundQuantizer(host.sign_round.SignRoundConfig(**config))
    q.model = model
    q.block_forward = host.block_runner.BlockForwardRunner(batch_size=batch_size, device=device, cache_device=device)
    q.calibration_context.batch_size = batch_size
    random.seed(seed)
    block_ctx = types.SimpleNamespace(block_name="block", block_index=0, block_cnt=2)
    best = q.quantize_block(model.block, inputs, others, outputs, None, block_ctx)
    return model, best, getattr(q, "losses", None)


def _clamped(best):
    """Best parameters with the range factors clamped to [0, 1], as every use reads them:
    AutoRound's wrapper clamps them in its forward, which an expert without tokens skips
    (a factor stepped past 1 stays there, and is kept as best so), and its unwrapper before
    writing the weights; the native loop quant-dequantizes, so clamps, every expert each
    iteration."""
    return {layer: {k: t.clamp(0, 1) if k != "value" else t for k, t in params.items()}
            for layer, params in best.items()}


def _assert_equal_tuning(a, b, a_best, b_best, clamp):
    if clamp:
        a_best, b_best = _clamped(a_best), _clamped(b_best)
    assert set(a_best) == set(b_best)
    for layer in a_best:
        for key, t in a_best[layer].items():
            assert torch.equal(t, b_best[layer][key]), (layer, key)
    for (n, x), y in zip(a.block.named_parameters(), b.block.parameters()):
        assert torch.equal(x, y), n
    assert_equal_unwraps(a.block, b.block)


def assert_equal_unwraps(a, b):
    """What each quantized layer's unwrap wrote besides its weight (scale, zp, iters): equal."""
    for (name, x), y in zip(a.named_modules(), b.modules()):
        if getattr(x, "bits", 16) <= 8:
            for key in ("scale", "zp", "iters"):
                u, v = getattr(x, key), getattr(y, key)
                assert (torch.equal(u, v) and u.dtype == v.dtype) if torch.is_tensor(u) else u == v, (name, key)


CASES = {"sym int4": dict(iters=30), "asym, a minmax lr of its own": dict(iters=20, minmax_lr=0.01),
         "gradient_accumulate_steps=2 (no v step in the backward)": dict(iters=12, gradient_accumulate_steps=2)}


@pytest.mark.parametrize("case", list(CASES))
def test_experts_tuned_together_equal_autorounds_per_expert_tuning(host, library, monkeypatch, case):  # noqa: F811
    config = dict(CASES[case], layers={"experts.%d.%s" % (e, p): {"sym": "asym" not in case}
                                       for e in range(EXPERTS) for p in ("up", "down")})
    own, own_best, own_losses = _tune(host, **config)
    assert min(own_losses) < own_losses[0]
    assert not own_best["experts.%d.up" % (EXPERTS - 1)]["value"].any()  # never routed: never stepped
    calls, steps = [], []
    qdq, step = native_loop.signround_qdq_experts, native_loop.signsgd_experts_step
    monkeypatch.setattr(native_loop, "signround_qdq_experts",
                        lambda experts, **kw: calls.append([n for n, *_ in experts]) or qdq(experts, **kw))
    monkeypatch.setattr(native_loop, "signsgd_experts_step",
                        lambda experts, *a, **kw: steps.append(len(experts)) or step(experts, *a, **kw))
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    tuned, best, _ = _tune(host, **config)
    counters = adapter.counters()["seams"]
    assert counters["quantize_block"]["qlink"] == 1
    assert counters["grouped_experts"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    assert counters["grouped_unwrap"] == {"qlink": 2, "host": 0, "fallback": 0, "reasons": {}}  # ups, downs
    assert calls[:2] == [["experts.%d.%s" % (e, p) for e in range(EXPERTS)] for p in ("up", "down")]
    assert steps == [1] * config["iters"]  # every tensor of the step in one call
    (_, losses), = adapter.losses()
    assert losses == own_losses
    _assert_equal_tuning(own, tuned, own_best, best, clamp=True)


def test_the_grouped_calls_equal_the_per_layer_native_loop(host, library, monkeypatch):  # noqa: F811
    """Bit for bit, best parameters unclamped included: grouping changes no arithmetic."""
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    grouped, grouped_best, _ = _tune(host, iters=20)
    monkeypatch.setattr(native_loop, "expert_groups", lambda layers: ([], "forced"))
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    single, single_best, _ = _tune(host, iters=20)
    assert adapter.counters()["seams"]["grouped_experts"]["reasons"] == {"forced": 1}
    _assert_equal_tuning(grouped, single, grouped_best, single_best, clamp=False)


def test_experts_unlike_each_other_send_the_whole_block_layer_by_layer(host, library):  # noqa: F811
    config = dict(iters=12, layers={"experts.2.up": {"group_size": 16}})
    own, own_best, own_losses = _tune(host, **config)
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    tuned, best, _ = _tune(host, **config)
    counters = adapter.counters()["seams"]
    assert counters["quantize_block"]["qlink"] == 1
    assert counters["grouped_experts"]["reasons"] == {
        "experts experts.*.up: expert 2 has options (4, 16, True, torch.float16, 1e-05), unlike expert 0's": 1}
    assert counters["grouped_unwrap"]["qlink"] == 2
    assert counters["grouped_unwrap"]["reasons"] == {"no other layer of its shape and options": 1}
    (_, losses), = adapter.losses()
    assert losses == own_losses
    _assert_equal_tuning(own, tuned, own_best, best, clamp=True)


def test_expert_groups_reads_hf_names():
    def layer(name, rows=8, options=(4, 32, True, torch.float16, 1e-5)):
        return name, torch.nn.Linear(32, rows), options
    groups, reason = native_loop.expert_groups(
        [layer("mlp.experts.10.up"), layer("mlp.experts.2.up"), layer("mlp.gate"), layer("self_attn.q_proj")])
    assert (groups, reason) == ([["mlp.experts.2.up", "mlp.experts.10.up"]], None)
    assert native_loop.expert_groups([layer("self_attn.q_proj")]) == ([], None)
    groups, reason = native_loop.expert_groups([layer("mlp.experts.0.up"), layer("mlp.experts.1.up", rows=4)])
    assert groups == [] and reason == "experts mlp.experts.*.up: expert 1 has weight shape (4, 32), unlike expert 0's"


def test_the_eager_iterations_keep_nothing_of_the_ones_before(host, library, monkeypatch):  # noqa: F811
    """The tensors alive after each eager iteration (the CPU runs every iteration eagerly, as
    a GPU does where the iteration cannot be captured) take the same bytes from the third
    on: each iteration's quant-dequantized weights are freed with it (they were kept by
    their own backward's context, 0.8 MB an iteration here, about 1.3 GB on a
    Qwen3-30B-A3B-shaped block)."""
    import gc
    sizes, iteration = [], native_loop.NativeTuning.iteration

    def measured(self):
        iteration(self)
        gc.collect()
        # By type, not isinstance: that reads __class__, which torch.distributed's deprecated
        # reduce_op answers with a warning.
        sizes.append(sum(t.numel() * t.element_size() for t in gc.get_objects() if issubclass(type(t), torch.Tensor)))
    monkeypatch.setattr(native_loop.NativeTuning, "iteration", measured)
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    _tune(host, iters=8, layers={"experts.%d.%s" % (e, p): {"sym": True}
                                 for e in range(EXPERTS) for p in ("up", "down")})
    assert len(sizes) == 8 and len(set(sizes[2:])) == 1, sizes


def test_the_native_loop_runs_transformers_experts_as_grouped_gemms(host, library, monkeypatch):  # noqa: F811
    """With grouped_moe=True the native loop's quant-dequantized expert weights reach the
    linear_loop seam's grouped GEMMs (each group's product made by a loop here, the CPU
    having no torch._grouped_mm): every iteration's loss and the tuned block equal the
    native loop's over AutoRound's per-expert calls, within float32 rounding."""
    from auto_round.modeling.fused_moe import moe_experts_interface
    monkeypatch.setattr(grouped_experts, "fits", lambda x: True)
    monkeypatch.setattr(torch, "_grouped_mm", _grouped_mm_by_loop, raising=False)
    runs = []
    for grouped in (False, True):
        adapter.install("auto", ctx=cpu(library, 1), strict=True, grouped_moe=grouped)
        moe_experts_interface.register_linear_loop_experts()  # AutoRound's prepare (the first: qlink's)
        model, best, _ = _tune(host, iters=12, block=InterfaceBlock)
        (_, losses), = adapter.losses()
        runs.append((model, best, losses, adapter.counters()["seams"]))
    (plain, plain_best, plain_losses, plain_counts), (mine, best, losses, counts) = runs
    assert plain_counts["grouped_moe"]["reasons"] == {"grouped_moe=False": plain_counts["grouped_moe"]["host"]}
    assert counts["grouped_moe"]["host"] == 0, counts["grouped_moe"]
    assert counts["grouped_moe"]["qlink"] == plain_counts["grouped_moe"]["host"]
    assert counts["quantize_block"]["qlink"] == 1 and counts["grouped_experts"]["qlink"] == 1
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(plain_losses), rtol=1e-5, atol=0)
    assert set(best) == set(plain_best)
    for (name, x), y in zip(mine.block.named_parameters(), plain.block.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)
