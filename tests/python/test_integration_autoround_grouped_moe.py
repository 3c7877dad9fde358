"""The grouped_moe seams over the AutoRound stand-in's sequential_moe_forward (an unfused
Qwen3-MoE block) and linear_loop_experts_forward (transformers 5's experts interface): off
by default and where no grouped GEMM runs (the CPU), AutoRound's loop with its output bit for
bit, the reason counted; what the grouped path does not cover named (wrapped or biased
projections, hooks, differing activations, the experts' own gating, forced routing); the
function transformers' mapping took while installed AutoRound's own once uninstalled; a bad
setting refused by name; AutoRound's imatrix hooks kept. The grouped path itself runs on a
GPU (test_cuda_grouped_moe.py)."""
import copy
import functools
import types

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

    class Wrapper(torch.nn.Module):  # AutoRound's WrapperLinear during its own tuning
        def __init__(self, layer):
            super().__init__()
            self.orig_layer = layer

    class Hooked(torch.nn.Linear):  # a Linear with a forward of its own (GPTQModel's HookedLinear)
        def forward(self, x):
            return super().forward(x)

    class Swapped(torch.nn.Linear):  # torch 1.13's functional_call swaps the class, not the forward
        pass
    original = moe.experts[1].up_proj
    moe.experts[1].up_proj = Wrapper(original)
    assert grouped_moe.refusal(x, moe.experts) == "expert 1's up_proj is not a plain Linear without bias (Wrapper)"
    moe.experts[1].up_proj = Hooked(HIDDEN, INTER, bias=False)
    assert grouped_moe.refusal(x, moe.experts) == "expert 1's up_proj is not a plain Linear without bias (Hooked)"
    moe.experts[1].up_proj = Swapped(HIDDEN, INTER, bias=False)
    assert grouped_moe.refusal(x, moe.experts) is None
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
    for forward in (module.sequential_moe_forward, lambda *args: grouped_moe.grouped_forward(*args)[0]):
        out = forward(x, chosen, weights, moe.experts, EXPERTS)
        results.append([out] + list(torch.autograd.grad((out ** 2).sum(), [x] + list(moe.experts.parameters()))))
    for theirs, mine in zip(*results):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


@pytest.fixture
def interface():
    with stand_in("auto_round", adapter):
        from auto_round.modeling.fused_moe import moe_experts_interface, utils
        torch.manual_seed(1)
        yield moe_experts_interface, utils, moe_experts_interface.LinearLoopExperts(HIDDEN, INTER, EXPERTS)


def _routing(x):
    weights, chosen = torch.topk(torch.softmax(torch.randn(x.shape[0], EXPERTS, dtype=x.dtype), -1), TOP_K)
    return chosen, weights / weights.sum(-1, keepdim=True)


def test_linear_loop_off_and_on_the_cpu_is_autorounds_and_uninstalled_its_own_again(interface, ctx):
    module, _, experts = interface
    x = torch.randn(TOKENS, HIDDEN)
    chosen, weights = _routing(x)
    theirs = module.linear_loop_experts_forward(experts, x, chosen, weights)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    module.register_linear_loop_experts()  # AutoRound's prepare, while installed: the mapping takes qlink's
    assert module.ALL_EXPERTS_FUNCTIONS._global_mapping["linear_loop"].__module__ == grouped_moe.__name__
    assert torch.equal(experts(x, chosen, weights), theirs)
    assert adapter.counters()["seams"]["grouped_moe"]["reasons"] == {
        "no grouped GEMM for torch.float32 rows on cpu": 1}
    adapter.uninstall()
    assert module.linear_loop_experts_forward.__module__ == module.__name__
    assert torch.equal(experts(x, chosen, weights), theirs)  # the mapping's function defers to AutoRound's


def _wrapping_disable(fn):
    """torch.compiler.disable's shape: a wrapper (functools.wraps) that calls fn."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return fn(*args, **kwargs)
    return run


def test_a_registration_made_before_install_goes_through_qlink_until_uninstalled(interface, ctx):
    """AutoRound prepared a model before install() (its function the mapping's first), or an
    earlier installation did: the mapping holds this installation's function until it is
    uninstalled, then what it held."""
    module, _, experts = interface
    mapping = module.ALL_EXPERTS_FUNCTIONS._global_mapping
    module.register_linear_loop_experts()
    theirs = mapping["linear_loop"]
    x = torch.randn(TOKENS, HIDDEN)
    chosen, weights = _routing(x)
    for grouped in (False, True):  # the second install replaces the first's function
        adapter.install("off", ctx=ctx, grouped_moe=grouped)
        experts(x, chosen, weights)
        assert adapter.counters()["seams"]["grouped_moe"]["host"] == 1
    assert mapping["linear_loop"].__module__ == grouped_moe.__name__
    adapter.uninstall()
    assert mapping["linear_loop"] is theirs


@pytest.mark.parametrize("compiler", [None, _wrapping_disable], ids=["plain", "wrapped for torch.compile"])
def test_a_registration_made_by_an_uninstalled_installation_goes_to_the_next(interface, ctx, monkeypatch, compiler):
    """AutoRound's prepare registered while an earlier installation was installed (the mapping
    holds that one's function, which defers to AutoRound's once uninstalled): the next
    installation takes the mapping over, its seams wrapped for torch.compile or not."""
    monkeypatch.setattr(torch, "compiler", types.SimpleNamespace(disable=compiler) if compiler else None,
                        raising=False)
    module, _, experts = interface
    mapping = module.ALL_EXPERTS_FUNCTIONS._global_mapping
    x = torch.randn(TOKENS, HIDDEN)
    chosen, weights = _routing(x)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    module.register_linear_loop_experts()
    earlier = mapping["linear_loop"]
    adapter.uninstall()
    adapter.install("off", ctx=ctx, grouped_moe=True)
    assert mapping["linear_loop"] is not earlier
    experts(x, chosen, weights)
    assert adapter.counters()["seams"]["grouped_moe"]["reasons"] == {
        "no grouped GEMM for torch.float32 rows on cpu": 1}
    adapter.uninstall()
    assert mapping["linear_loop"] is earlier


def test_what_the_linear_loop_path_does_not_cover_is_named(interface, ctx, monkeypatch):
    module, utils, experts = interface
    monkeypatch.setattr(grouped_experts, "fits", lambda x: True)
    monkeypatch.setattr(grouped_moe, "grouped_forward", lambda *args, **kwargs: pytest.fail("not to run"))
    x = torch.randn(TOKENS, HIDDEN)
    chosen, weights = _routing(x)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    monkeypatch.setattr(utils, "FORCE_ALL_EXPERTS", True)
    module.linear_loop_experts_forward(experts, x, chosen, weights)
    monkeypatch.setattr(utils, "FORCE_ALL_EXPERTS", False)

    def tanh_gate(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.tanh(gate) * up
    experts._apply_gate = tanh_gate  # transformers' default gate (the class's) takes the grouped GEMMs
    module.linear_loop_experts_forward(experts, x, chosen, weights)
    del experts._apply_gate
    handle = getattr(experts, "2").up_proj.register_forward_hook(lambda *args: None)
    module.linear_loop_experts_forward(experts, x, chosen, weights)
    handle.remove()
    assert adapter.counters()["seams"]["grouped_moe"]["reasons"] == {
        "every expert's forced routing (AutoRound's coverage pass)": 1, "the experts' own gate (tanh_gate)": 1,
        "expert 2.up_proj is hooked": 1}


def test_the_linear_loop_grouped_arithmetic_is_autorounds(interface, ctx, monkeypatch):
    """The linear_loop seam's grouped path with each group's product made by a loop (float64,
    the CPU): the output and every gradient AutoRound's loop's."""
    module, _, experts = interface
    monkeypatch.setattr(torch, "_grouped_mm", _grouped_mm_by_loop, raising=False)
    monkeypatch.setattr(grouped_experts, "fits", lambda x: True)
    experts = experts.double()
    x = torch.randn(2, TOKENS // 2, HIDDEN, dtype=torch.float64, requires_grad=True)
    chosen, weights = _routing(x.detach().reshape(-1, HIDDEN))
    theirs = module.linear_loop_experts_forward
    adapter.install("off", ctx=ctx, grouped_moe=True)
    results = []
    for forward in (theirs, module.linear_loop_experts_forward):
        out = forward(experts, x, chosen.view(2, -1, TOP_K), weights.view(2, -1, TOP_K))
        results.append([out] + list(torch.autograd.grad((out ** 2).sum(), [x] + list(experts.parameters()))))
    assert adapter.counters()["seams"]["grouped_moe"]["qlink"] == 1
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_autorounds_imatrix_hooks_are_kept_by_the_grouped_path(interface, ctx, monkeypatch):
    """At iters=0 AutoRound's optimized RTN hooks every quantized linear to collect its
    imatrix in the block's reference forward: the grouped path keeps them, each projection's
    imatrix within fp32 rounding of the hooks' over AutoRound's loop, its row count equal, and
    an expert no token reached none; a hook of another kind still sends the block to the loop."""
    from auto_round.algorithms.quantization.rtn.quantizer import OptimizedRTNQuantizer
    module, _, experts = interface
    monkeypatch.setattr(torch, "_grouped_mm", _grouped_mm_by_loop, raising=False)
    monkeypatch.setattr(grouped_experts, "fits", lambda x: True)
    for expert in range(EXPERTS):
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(getattr(experts, str(expert)), name).bits = 4
    xs = [torch.randn(TOKENS, HIDDEN) for _ in range(3)]
    routes = [_routing(x) for x in xs]
    for chosen, _ in routes:
        chosen[chosen == EXPERTS - 1] = 0  # the last expert never reached

    def collected(forward):
        clone = copy.deepcopy(experts)
        handles = OptimizedRTNQuantizer(None)._register_imatrix_hooks(clone, with_count=True)
        for x, (chosen, weights) in zip(xs, routes):
            forward(clone, x, chosen, weights)
        for handle in handles:
            handle.remove()
        return {n: (m.imatrix, m.imatrix_cnt) for n, m in clone.named_modules() if hasattr(m, "imatrix")}
    theirs = collected(module.linear_loop_experts_forward)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    mine = collected(module.linear_loop_experts_forward)
    assert adapter.counters()["seams"]["grouped_moe"] == {"qlink": 3, "host": 0, "fallback": 0, "reasons": {}}
    assert sorted(mine) == sorted(theirs) and not any(n.startswith("%d." % (EXPERTS - 1)) for n in mine)
    for name, (imatrix, count) in theirs.items():
        assert mine[name][1] == count, name
        torch.testing.assert_close(mine[name][0], imatrix, rtol=1e-6, atol=0, msg=name)
    assert mine["0.gate_proj"][0] is not mine["0.up_proj"][0]
    handle = getattr(experts, "1").down_proj.register_forward_hook(lambda *args: None)
    collected(module.linear_loop_experts_forward)
    handle.remove()
    assert adapter.counters()["seams"]["grouped_moe"]["reasons"] == {"expert 1.down_proj is hooked": 3}


def test_imatrix_additions_at_once_equal_the_hooks_one_after_another():
    """add_imatrices of a forward's additions (a module twice, a new one, one counted and one
    not, an imatrix in float64) leaves each module as add_imatrix one by one does, bit for bit."""
    from qlink.integrations.autoround.contract import add_imatrices, add_imatrix
    torch.manual_seed(0)
    squares = [torch.rand(16) for _ in range(6)]

    def modules():
        mods = [torch.nn.Linear(16, 4) for _ in range(4)]
        mods[0].imatrix, mods[0].imatrix_cnt = torch.rand(16), 3
        mods[1].imatrix = torch.rand(16)
        mods[3].imatrix, mods[3].imatrix_cnt = torch.rand(16, dtype=torch.float64), 1
        return mods
    ours, theirs = modules(), modules()
    for a, b in zip(ours, theirs):
        if hasattr(b, "imatrix"):
            a.imatrix = b.imatrix.clone()
    plan = [(0, 0, 5, True), (1, 1, 7, False), (2, 2, 2, True), (0, 3, 4, True), (3, 4, 6, True), (2, 5, 1, True)]
    add_imatrices([(ours[m], squares[s], rows, count) for m, s, rows, count in plan])
    for m, s, rows, count in plan:
        add_imatrix(theirs[m], squares[s] if hasattr(theirs[m], "imatrix") else squares[s].clone(), rows, count)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.imatrix, b.imatrix) and a.imatrix.dtype == b.imatrix.dtype
        assert getattr(a, "imatrix_cnt", None) == getattr(b, "imatrix_cnt", None)
    assert ours[2].imatrix is not squares[2]


def test_a_grouped_forward_that_fails_runs_autorounds_loop_or_raises_under_strict(interface, ctx, monkeypatch):
    from qlink.integrations.patches import FallbackRefused
    module, _, experts = interface
    monkeypatch.setattr(grouped_experts, "fits", lambda x: True)

    def failing(*args, **kwargs):
        raise RuntimeError("no grouped GEMM today")
    monkeypatch.setattr(torch, "_grouped_mm", failing, raising=False)
    x = torch.randn(TOKENS, HIDDEN)
    chosen, weights = _routing(x)
    theirs = module.linear_loop_experts_forward(experts, x, chosen, weights)
    adapter.install("off", ctx=ctx, grouped_moe=True)
    assert torch.equal(module.linear_loop_experts_forward(experts, x, chosen, weights), theirs)
    assert adapter.counters()["seams"]["grouped_moe"] == {
        "qlink": 0, "host": 0, "fallback": 1, "reasons": {"RuntimeError: no grouped GEMM today": 1}}
    adapter.install("off", ctx=ctx, grouped_moe=True, strict=True)
    with pytest.raises(FallbackRefused, match="no grouped GEMM today"):
        module.linear_loop_experts_forward(experts, x, chosen, weights)
