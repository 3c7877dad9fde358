"""AutoRound's unfused MoE block through the grouped_moe seam on a GPU (bf16, sm90+, PyTorch's
grouped GEMM): the output and the gradients of the input and of every expert's weights
within bf16 rounding of AutoRound's loop's (the stand-in's sequential_moe_forward, and its
linear_loop_experts_forward), the grouped path counted; skipped without such a GPU."""
import pytest
import torch

from qlink.integrations import autoround as adapter
from qlink.integrations import grouped_experts

from test_integration_autoround_grouped_moe import (  # noqa: F401 (fixtures)
    EXPERTS, HIDDEN, TOKENS, TOP_K, block, ctx, interface)

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


def test_the_linear_loop_experts_grouped_equal_autorounds_loop_within_bf16_rounding(interface, ctx):  # noqa: F811
    module, _, experts = interface
    experts = experts.cuda().to(torch.bfloat16)
    x = torch.randn(TOKENS * 8, HIDDEN, device="cuda").to(torch.bfloat16)
    weights, chosen = torch.topk(torch.softmax(torch.randn(x.shape[0], EXPERTS, device="cuda"), -1), TOP_K)
    weights = (weights / weights.sum(-1, keepdim=True)).to(torch.bfloat16)

    def run(forward):
        experts.zero_grad()
        rows = x.clone().requires_grad_()
        out = forward(experts, rows, chosen, weights)
        (out.float() ** 2).sum().backward()
        return [out.detach(), rows.grad] + [p.grad.clone() for p in experts.parameters()]
    theirs = run(module.linear_loop_experts_forward)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    mine = run(module.linear_loop_experts_forward)
    assert adapter.counters()["seams"]["grouped_moe"]["qlink"] == 1
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1.6e-2, atol=1e-2)
