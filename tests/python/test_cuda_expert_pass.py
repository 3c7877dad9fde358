"""The expert stage's routed pass on a GPU (PyTorch's grouped GEMM, bf16, sm90+): the
block's output and the down rows within bf16 rounding of the per-expert loop's, the gate/up
rows and the counts equal, split experts equal to fused; split experts' replay (the
routed_experts patch with expert_stage=True) grouped where nothing watches, deterministic,
the loop where a hook does; on two GPUs, experts' Hessians summed on the second equal the
first's; skipped without such GPUs."""
import pytest
import qlink
import torch
from torch import nn

from qlink.integrations import gptqmodel as adapter
from qlink.integrations import grouped_experts
from qlink.integrations.gptqmodel import expert_hessians, expert_pass
from qlink.quant import HessianAccumulator
from qlink.integrations.gptqmodel.expert_layout import ExpertWeights

from stand_in_hosts import stand_in

from test_defuser_standin import Config, Experts, defuser  # noqa: F401 (the fixture)
from test_integration_gptqmodel_experts import Block, Layer, Recorded

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9 or not grouped_experts.GROUPED_MM,
    reason="needs an sm90+ GPU and torch._grouped_mm")

HIDDEN, INTER, EXPERTS, TOP_K, TOKENS = 256, 128, 16, 2, 512


def _layer():
    gen = torch.Generator(device="cuda").manual_seed(0)
    experts = Experts(Config(hidden=HIDDEN, inter=INTER, experts=EXPERTS, top_k=TOP_K)).cuda()
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(experts.gate_up_proj.shape, generator=gen, device="cuda") / 16)
        experts.down_proj.copy_(torch.randn(experts.down_proj.shape, generator=gen, device="cuda") / 16)
    router = nn.Linear(HIDDEN, EXPERTS, bias=False, device="cuda")
    router.weight.data = torch.randn(EXPERTS, HIDDEN, generator=gen, device="cuda")
    return Layer(Block(experts, router)).to(torch.bfloat16)


def _run(layer, record, grouped, monkeypatch, sink=None):
    monkeypatch.setattr(grouped_experts, "GROUPED_MM", grouped)
    sink = Recorded() if sink is None else sink
    routed = expert_pass.ExpertPass(ExpertWeights(layer.mlp.experts), record, sink)
    x = torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator(device="cuda").manual_seed(1), device="cuda")
    with torch.no_grad(), routed.installed_on(layer.mlp.experts):
        out = layer.mlp(x.to(torch.bfloat16))
    return out, routed, sink


@pytest.mark.parametrize("record", ["inputs", "intermediates"])
def test_grouped_pass_equals_the_loop_within_bf16_rounding(record, monkeypatch):
    layer = _layer()
    looped_out, looped, looped_rows = _run(layer, record, False, monkeypatch)
    grouped_out, grouped, grouped_rows = _run(layer, record, True, monkeypatch)
    assert grouped.grouped is not None and looped.grouped is None
    assert grouped.totals() == looped.totals()
    rows, _ = grouped.totals()
    assert rows[-1] == 0 and sum(rows) == TOKENS * TOP_K  # the test block never routes to the last expert
    torch.testing.assert_close(grouped_out, looped_out, rtol=1.6e-2, atol=1e-3)
    for e in range(EXPERTS - 1):
        if record == "inputs":
            assert torch.equal(grouped_rows.rows(e), looped_rows.rows(e)), e
        else:
            torch.testing.assert_close(grouped_rows.rows(e), looped_rows.rows(e), rtol=1.6e-2, atol=1e-3, msg=str(e))


def test_grouped_split_experts_equal_fused(defuser, monkeypatch):  # noqa: F811
    fused = _layer()
    experts = fused.mlp.experts
    split = Layer(Block(defuser.DefusedExperts([
        defuser.DefusedExpert(experts.gate_up_proj[e, :INTER], experts.gate_up_proj[e, INTER:], experts.down_proj[e],
                              experts.act_fn) for e in range(EXPERTS)]), fused.mlp.router))
    fused_out, _, _ = _run(fused, "intermediates", True, monkeypatch)
    split_out, routed, _ = _run(split, "intermediates", True, monkeypatch)
    assert routed.grouped is not None
    assert torch.equal(fused_out, split_out)


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        yield qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library)


def test_unwatched_split_experts_replay_as_grouped_gemms(defuser, host, monkeypatch):  # noqa: F811
    experts = _layer().mlp.experts
    split = defuser.DefusedExperts([
        defuser.DefusedExpert(experts.gate_up_proj[e, :INTER], experts.gate_up_proj[e, INTER:], experts.down_proj[e],
                              experts.act_fn) for e in range(EXPERTS)])
    gen = torch.Generator(device="cuda").manual_seed(2)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)
    weights, chosen = torch.topk(torch.randn(TOKENS, EXPERTS, generator=gen, device="cuda").softmax(-1), TOP_K)
    weights = weights.to(torch.bfloat16)
    grouped_calls, linears = [], grouped_experts.linears
    monkeypatch.setattr(grouped_experts, "linears", lambda *a: grouped_calls.append(1) or linears(*a))
    with torch.no_grad():
        adapter.install(ctx=host, strict=True, expert_stage=False)
        looped = split(hidden, chosen, weights)
        assert not grouped_calls  # expert_stage=False: qlink's loop
        adapter.install(ctx=host, strict=True, expert_stage=True)
        grouped = split(hidden, chosen, weights)
        torch.cuda.set_sync_debug_mode("error")  # the replay queues its kernels without waiting for them
        try:
            again = split(hidden, chosen, weights)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert len(grouped_calls) == 2
        assert torch.equal(grouped, again)
        torch.testing.assert_close(grouped, looped, rtol=1.6e-2, atol=1e-3)
        split[0].up_proj.register_forward_hook(lambda module, inputs, output: None)
        assert torch.equal(split(hidden, chosen, weights), looped) and len(grouped_calls) == 2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("record", ["inputs", "intermediates"])
def test_experts_placed_on_another_gpu_sum_what_the_rows_gpu_sums(ctx, record, monkeypatch):
    """Experts placed on cuda:1 (apart, and one range) are summed there from their rows'
    copies: bit for bit the Hessians summed on the rows' GPU."""
    layer, other = _layer(), torch.device("cuda", 1)
    results = []
    for placed in ({}, {e: other for e in (1, 4, 6, 7)}, {e: other for e in range(8, EXPERTS)}):
        sink = expert_hessians.ChunkHessians(HessianAccumulator(ctx), list(range(EXPERTS)), placed)
        _run(layer, record, True, monkeypatch, sink=sink)
        torch.cuda.synchronize(other)
        assert all(h.device == placed.get(e, torch.device("cuda", 0)) for e, h in sink.partials.items())
        results.append(sink.partials)
    whole = results[0]
    assert sorted(whole) == list(range(EXPERTS - 1))
    for partials in results[1:]:
        assert sorted(partials) == sorted(whole)
        assert all(torch.equal(partials[e].cpu(), whole[e].cpu()) for e in whole)
