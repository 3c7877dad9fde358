"""AutoRound's unfused MoE block through the grouped_moe seam on a GPU (bf16, sm90+, PyTorch's
grouped GEMM): the output and the gradients of the input and of every expert's weights
within bf16 rounding of AutoRound's loop's (the stand-in's sequential_moe_forward, and its
linear_loop_experts_forward), the grouped path counted; and the native loop over a
transformers-style Qwen3-MoE block with the experts grouped: no host read in an iteration,
so its step replays as a CUDA graph. Skipped without such a GPU."""
import pytest
import torch

from qlink.integrations import autoround as adapter
from qlink.integrations import grouped_experts

from test_integration_autoround import host  # noqa: F401 (fixture)
from test_integration_autoround_experts import InterfaceBlock, _tune
from test_integration_autoround_grouped_moe import (  # noqa: F401 (fixtures)
    EXPERTS, HIDDEN, TOKENS, TOP_K, block, interface)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9 or not grouped_experts.GROUPED_MM,
    reason="needs an sm90+ GPU and torch._grouped_mm")


def _run(moe, x):
    moe.zero_grad()
    x = x.clone().requires_grad_()
    out = moe(x)
    (out.float() ** 2).sum().backward()
    return out.detach(), x.grad, [p.grad.clone() for p in moe.experts.parameters()]


def test_grouped_experts_equal_autorounds_loop_within_bf16_rounding(block, ctx):  # noqa: F811
    _, moe = block
    moe = moe.cuda().to(torch.bfloat16)
    x = torch.randn(2, TOKENS * 8, HIDDEN, device="cuda").to(torch.bfloat16)
    theirs = _run(moe, x)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    mine = _run(moe, x)
    assert adapter.counters()["seams"]["grouped_moe"]["qlink"] == 1
    torch.testing.assert_close(mine[0], theirs[0], rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(mine[1], theirs[1], rtol=1.6e-2, atol=1e-2)
    for a, b in zip(mine[2], theirs[2]):
        torch.testing.assert_close(a, b, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("rows, autocast", [(torch.bfloat16, None), (torch.float32, torch.bfloat16)],
                         ids=["bf16 rows", "fp32 rows under bf16 autocast"])
def test_the_linear_loop_experts_grouped_equal_autorounds_loop_within_bf16_rounding(
        interface, ctx, rows, autocast):  # noqa: F811
    """Also AutoRound's block forward with amp: fp32 rows (the residual stream) reach the
    experts under bf16 autocast, every linear computing in bf16; they take the grouped GEMMs too."""
    module, _, experts = interface
    experts = experts.cuda().to(torch.bfloat16)
    x = torch.randn(TOKENS * 8, HIDDEN, device="cuda").to(rows)
    weights, chosen = torch.topk(torch.softmax(torch.randn(x.shape[0], EXPERTS, device="cuda"), -1), TOP_K)
    weights = (weights / weights.sum(-1, keepdim=True)).to(rows)

    def run(forward):
        experts.zero_grad()
        inputs = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
            out = forward(experts, inputs, chosen, weights)
        (out.float() ** 2).sum().backward()
        return [out.detach(), inputs.grad] + [p.grad.clone() for p in experts.parameters()]
    theirs = run(module.linear_loop_experts_forward)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    mine = run(module.linear_loop_experts_forward)
    assert adapter.counters()["seams"]["grouped_moe"]["qlink"] == 1
    for a, b in zip(mine, theirs):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1.6e-2, atol=1e-2)


def test_rows_a_linear_computes_in_float16_take_autorounds_loop(interface, ctx):  # noqa: F811
    """Under fp16 autocast AutoRound's linears compute in fp16, which PyTorch's grouped GEMM
    does not: its loop runs, the reason counted."""
    module, _, experts = interface
    experts = experts.cuda().to(torch.bfloat16)
    x = torch.randn(TOKENS * 8, HIDDEN, device="cuda").to(torch.bfloat16)
    weights, chosen = torch.topk(torch.softmax(torch.randn(x.shape[0], EXPERTS, device="cuda"), -1), TOP_K)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        module.linear_loop_experts_forward(experts, x, chosen, weights.to(torch.bfloat16))
    seam = adapter.counters()["seams"]["grouped_moe"]
    why = "no grouped GEMM for torch.bfloat16 rows computed in torch.float16 on cuda:0"
    assert seam["qlink"] == 0 and seam["reasons"] == {why: 1}, seam


def test_the_seam_runs_as_python_inside_a_compiled_block_forward(interface, ctx):  # noqa: F811
    """AutoRound compiles its block forward: traced there, the gate check read transformers'
    default gate's __name__ as a class descriptor and sent every tuning call to AutoRound's
    loop. The seam runs eagerly inside the compiled caller: the default gate takes the
    grouped GEMMs, every call counted, the output the eager seam's."""
    module, _, experts = interface
    experts = experts.cuda().to(torch.bfloat16)
    x = torch.randn(TOKENS * 8, HIDDEN, device="cuda").to(torch.bfloat16)
    weights, chosen = torch.topk(torch.softmax(torch.randn(x.shape[0], EXPERTS, device="cuda"), -1), TOP_K)
    weights = (weights / weights.sum(-1, keepdim=True)).to(torch.bfloat16)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    with torch.no_grad():
        expected = module.linear_loop_experts_forward(experts, x, chosen, weights)
        compiled = torch.compile(lambda rows: module.linear_loop_experts_forward(experts, rows, chosen, weights))
        outputs = [compiled(x) for _ in range(2)]
    seam = adapter.counters()["seams"]["grouped_moe"]
    assert seam["qlink"] == 3 and seam["host"] == 0, seam
    for out in outputs:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_the_native_loop_replays_a_transformers_moe_block_grouped_as_a_graph(host, ctx, monkeypatch):  # noqa: F811
    """bf16 on one GPU: with grouped_moe=True every iteration's experts are the grouped
    GEMMs, nothing reads the device from the host, and the step is captured (step_graph);
    AutoRound's per-expert calls, which read each expert's row count, run eagerly. The
    tuned block's losses agree within bf16 rounding (the first ones) and their best within 2 %."""
    from auto_round.modeling.fused_moe import moe_experts_interface
    from auto_round.utils import device_manager
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(device_manager.device_manager, "device", gpu)
    runs = []
    for grouped in (False, True):
        adapter.install("auto", ctx=ctx, strict=True, grouped_moe=grouped)
        moe_experts_interface.register_linear_loop_experts()  # AutoRound's prepare (the first: qlink's)
        _tune(host, iters=30, block=InterfaceBlock, device=gpu, dtype=torch.bfloat16)
        (_, losses), = adapter.losses()
        runs.append((losses, adapter.counters()["seams"]))
    (plain_losses, plain), (losses, mine) = runs
    assert plain["step_graph"]["qlink"] == 0 and plain["grouped_moe"]["qlink"] == 0
    assert mine["step_graph"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    assert mine["grouped_moe"]["host"] == 0 and mine["grouped_moe"]["qlink"] > 0
    assert losses[:2] == pytest.approx(plain_losses[:2], rel=2e-2)
    assert min(losses) == pytest.approx(min(plain_losses), rel=2e-2)


def test_autorounds_imatrix_hooks_kept_on_the_gpu(interface, ctx):  # noqa: F811
    """AutoRound's imatrix hooks on the grouped path (one segmented reduction on the GPU):
    the gate/up inputs' sums within fp32 rounding of the hooks' over AutoRound's loop, the
    down inputs' within bf16 rounding (its rows come from another GEMM), the counts equal."""
    import copy

    from auto_round.algorithms.quantization.rtn.quantizer import OptimizedRTNQuantizer
    module, _, experts = interface
    experts = experts.cuda().to(torch.bfloat16)
    for m in experts.modules():
        if isinstance(m, torch.nn.Linear):
            m.bits = 4
    x = torch.randn(TOKENS * 8, HIDDEN, device="cuda").to(torch.bfloat16)
    weights, chosen = torch.topk(torch.softmax(torch.randn(x.shape[0], EXPERTS, device="cuda"), -1), TOP_K)
    weights = (weights / weights.sum(-1, keepdim=True)).to(torch.bfloat16)

    def collected():
        clone = copy.deepcopy(experts)
        handles = OptimizedRTNQuantizer(None)._register_imatrix_hooks(clone, with_count=True)
        with torch.no_grad():
            module.linear_loop_experts_forward(clone, x, chosen, weights)
        for handle in handles:
            handle.remove()
        return {n: (m.imatrix, m.imatrix_cnt) for n, m in clone.named_modules() if hasattr(m, "imatrix")}
    theirs = collected()
    adapter.install("off", ctx=ctx, grouped_moe=True)
    mine = collected()
    assert adapter.counters()["seams"]["grouped_moe"]["qlink"] == 1
    assert sorted(mine) == sorted(theirs)
    for name, (imatrix, count) in theirs.items():
        assert mine[name][1] == count, name
        tolerance = 2e-2 if name.endswith("down_proj") else 1e-5
        torch.testing.assert_close(mine[name][0], imatrix, rtol=tolerance, atol=1e-3, msg=name)
