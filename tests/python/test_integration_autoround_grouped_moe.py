"""The grouped_moe seam over the AutoRound stand-in's sequential_moe_forward (an unfused
Qwen3-MoE block): off by default and where no grouped GEMM runs (the CPU), AutoRound's loop
with its output bit for bit, the reason counted; what the grouped path does not cover named
(wrapped or biased projections, hooks, differing activations); a bad setting refused by name.
The grouped path itself runs on a GPU (test_cuda_grouped_moe.py)."""
import pytest
import qlink
import torch

from qlink.integrations import autoround as adapter
from qlink.integrations import grouped_experts
from qlink.integrations.autoround import grouped_moe

from stand_in_hosts import stand_in

HIDDEN, INTER, EXPERTS, TOP_K, TOKENS = 32, 16, 6, 2, 40


@pytest.fixture
def block():
    with stand_in("auto_round", adapter):
        from auto_round.modeling.unfused_moe import qwen3_moe
        torch.manual_seed(0)
        yield qwen3_moe, qwen3_moe.LinearQwen3MoeSparseMoeBlock(HIDDEN, INTER, EXPERTS, TOP_K)


@pytest.fixture
def ctx(library):
    return qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library)


def test_off_and_without_a_grouped_gemm_autoround_runs_its_loop(block, ctx):
    module, moe = block
    x = torch.randn(2, TOKENS // 2, HIDDEN)
    theirs = moe(x)
    for grouped, reason in ((False, "grouped_moe=False"), (True, "no grouped GEMM for torch.float32 rows on cpu")):
        adapter.install("off", ctx=ctx, grouped_moe=grouped)
        assert module.sequential_moe_forward.__module__ == grouped_moe.__name__  # the block's own binding
        assert torch.equal(moe(x), theirs)
        assert adapter.counters()["seams"]["grouped_moe"]["reasons"] == {reason: 1}
    with pytest.raises(ValueError, match="grouped_moe must be True or False, got 'yes'"):
        adapter.install("off", ctx=ctx, grouped_moe="yes")


def test_what_the_grouped_path_does_not_cover_is_named(block, monkeypatch):
    _, moe = block
    monkeypatch.setattr(grouped_experts, "fits", lambda x: True)
    x = torch.randn(TOKENS, HIDDEN)
    assert grouped_moe.refusal(x, moe.experts) is None

    class Wrapper(torch.nn.Linear):  # AutoRound's wrapped layers during its own tuning
        pass
    wrapped = Wrapper(HIDDEN, INTER, bias=False)
    original, moe.experts[1].up_proj = moe.experts[1].up_proj, wrapped
    assert grouped_moe.refusal(x, moe.experts) == "expert 1's up_proj is not a plain Linear without bias (Wrapper)"
    moe.experts[1].up_proj = original
    handle = moe.experts[2].down_proj.register_forward_hook(lambda *args: None)
    assert grouped_moe.refusal(x, moe.experts) == "expert 2.down_proj is hooked"
    handle.remove()
    moe.experts[3].act_fn = torch.nn.GELU()
    assert grouped_moe.refusal(x, moe.experts) == "the experts' activations differ"


def _grouped_mm_by_loop(x, w, offs):
    """torch._grouped_mm's arithmetic (rows offs[e-1]:offs[e] times w[e]), one product a group."""
    parts, start = [], 0
    for expert, end in enumerate(offs.tolist()):
        parts.append(x[start:end] @ w[expert])
        start = end
    return torch.cat(parts)


def test_the_grouped_arithmetic_is_autorounds_rows_weights_and_sums(block, monkeypatch):
    """grouped_forward with each group's product made by a loop (float64, the CPU): the
    output and every gradient (input, each expert's weights) AutoRound's loop's."""
    module, moe = block
    monkeypatch.setattr(torch, "_grouped_mm", _grouped_mm_by_loop, raising=False)
    moe = moe.double()
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.float64, requires_grad=True)
    weights, chosen = torch.topk(torch.softmax(moe.gate(x), -1).detach(), TOP_K)
    results = []
    for forward in (module.sequential_moe_forward, grouped_moe.grouped_forward):
        out = forward(x, chosen, weights, moe.experts, EXPERTS)
        results.append([out] + list(torch.autograd.grad((out ** 2).sum(), [x] + list(moe.experts.parameters()))))
    for theirs, mine in zip(*results):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
