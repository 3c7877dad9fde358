"""The routed_experts patch (qlink's loop over defuser's split experts) against the defuser
stand-in (bench/hosts/standins) and the stand-in GPTQModel on the CPU backend: the same
output and the same rows for every expert's hooks, in the same order, as defuser's loop;
in a grouped forward, each expert's Hessian sums its rows sample by sample, bit-identical to
the samples' own forwards; MoE batches grouped only where the experts run qlink's loop; a
grouped 2-D input whose samples are not known takes GPTQModel's path; a failing sort runs
defuser's loop."""
import pytest
import torch

from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel import defuser_moe, input_cache
from qlink.integrations.patches import FallbackRefused

from test_defuser_standin import defuser  # noqa: F401 (the fixture: the stand-in importable before qlink installs)
from test_integration_gptqmodel_groups import SEQ, _capture, _looper, _moe_layer, host  # noqa: F401

HIDDEN, INTER, EXPERTS, TOP_K = 32, 24, 6, 2


def experts(defuser, seed=0):  # noqa: F811 (the fixture's value)
    gen = torch.Generator().manual_seed(seed)
    made = []
    for _ in range(EXPERTS):
        gate, up = (torch.randn(INTER, HIDDEN, generator=gen) / 4 for _ in range(2))
        made.append(defuser.DefusedExpert(gate, up, torch.randn(HIDDEN, INTER, generator=gen) / 4,
                                          torch.nn.functional.silu))
    return defuser.DefusedExperts(made)


def routing(tokens, seed):
    """Each token's top-2 experts and weights; the last expert never chosen."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, EXPERTS, generator=gen)
    logits[:, -1] = -float("inf")
    weights, chosen = torch.topk(logits.softmax(-1), TOP_K, dim=-1)
    return torch.randn(tokens, HIDDEN, generator=gen), chosen, weights


def recorded(module):
    """Each expert linear's inputs as its forward hooks see them, in call order."""
    seen = []
    for i, expert in enumerate(module):
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(expert, name).register_forward_hook(
                lambda m, inp, out, key="%d.%s" % (i, name): seen.append((key, inp[0].clone())))
    return seen


def test_qlinks_loop_gives_defusers_output_and_hook_inputs_bit_for_bit(defuser, host):  # noqa: F811
    module = experts(defuser)
    seen = recorded(module)
    hidden, chosen, weights = routing(3 * SEQ, seed=1)
    theirs = module(hidden, chosen, weights)
    theirs_seen = list(seen)
    seen.clear()
    adapter.install(ctx=host, strict=True)
    mine = module(hidden, chosen, weights)
    assert torch.equal(mine, theirs)
    assert [k for k, _ in seen] == [k for k, _ in theirs_seen] and "5.gate_proj" not in dict(seen)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(seen, theirs_seen))
    assert adapter.counters()["seams"]["routed_experts"]["qlink"] == 1


def calibrate(defuser, forwards):  # noqa: F811
    """GPTQ tasks fed by every expert linear's hook, as GPTQModel's loop feeds them; the
    forwards run. Returns each task's (partial after the last forward, rows, reached) and
    each down_proj's inputs as its hook saw them."""
    from gptqmodel.looper import gptq_processor
    from gptqmodel.quantization import config
    module, tasks, downs = experts(defuser), {}, {}
    for i, expert in enumerate(module):
        for name in ("gate_proj", "up_proj", "down_proj"):
            key = "%d.%s" % (i, name)
            g = tasks[key] = gptq_processor.GPTQ(getattr(expert, name), config.QuantizeConfig())

            def hook(m, inp, out, g=g, key=key):
                downs.setdefault(key, []).append(inp[0].clone())
                g.add_batch(inp[0].data, out.data)
            getattr(expert, name).register_forward_hook(hook)
    with torch.no_grad():
        for hidden, chosen, weights in forwards:
            module(hidden, chosen, weights)
    adapter.flush_hessians()
    return {k: (g._device_hessian_partials.get(torch.device("cpu")), g.nsamples, g.fwd_counter > 0)
            for k, g in tasks.items()}, downs


def test_a_grouped_forward_sums_each_samples_rows_as_its_own_forward_did(defuser, host, monkeypatch):  # noqa: F811
    """gate/up read the gathered hidden rows: their Hessians equal the samples' own forwards'
    bit for bit. down reads the expert's intermediate, computed here for all samples' rows in
    one product, which may round apart from one sample's: its Hessian equals its own rows'
    rank-k updates added sample by sample."""
    from qlink.quant import HessianAccumulator
    samples = [routing(SEQ, seed=10 + s) for s in range(4)]
    adapter.install(ctx=host, strict=True)
    alone, _ = calibrate(defuser, samples)
    monkeypatch.setattr(input_cache, "GROUP_ROWS", 4 * SEQ)
    assert len(_looper(_capture()).loop(0).layer_inputs) == 2  # the loop's batches grouped four to a forward
    grouped, inputs = calibrate(defuser, [tuple(torch.cat(parts) for parts in zip(*samples))])
    assert alone.keys() == grouped.keys() and alone["5.gate_proj"] == grouped["5.gate_proj"] == (None, 0, False)
    for key, (partial, rows, reached) in alone.items():
        other, other_rows, other_reached = grouped[key]
        assert rows == other_rows and reached == other_reached, key
        if partial is None:
            continue
        if not key.endswith("down_proj"):
            assert torch.equal(partial, other), key
            continue
        expert = int(key.split(".")[0])
        counts = [int((chosen == expert).sum()) for _, chosen, _ in samples]
        (x,) = inputs[key]
        reference = None
        for block in torch.split(x, counts):
            if block.shape[0]:
                reference = HessianAccumulator(host).add(block, reference)
        assert torch.equal(other, reference), key
        assert torch.allclose(other, partial, rtol=1e-4, atol=1e-4), key


def test_moe_batches_are_grouped_only_where_the_experts_run_qlinks_loop(defuser, host):  # noqa: F811
    from gptqmodel.models.base import BaseQModel
    adapter.install(ctx=host, strict=True)
    split = torch.nn.Module()
    split.mlp = torch.nn.Module()
    split.mlp.experts = experts(defuser)
    qwen3_moe = type("Qwen3MoeQModel", (BaseQModel,), {"dynamic_expert_index": "num_experts"})
    assert len(_looper(_capture(), model_class=qwen3_moe, layers=[split]).loop(0).layer_inputs) == 1
    host_cache = _capture()
    assert _looper(host_cache, model_class=qwen3_moe, layers=[_moe_layer()]).loop(0) is host_cache
    (said,) = adapter.counters()["seams"]["group_batches"]["reasons"]
    assert said == "MoE experts not split by defuser (Module): their loop does not tell each sample's rows"


def test_a_grouped_2d_input_whose_samples_are_unknown_takes_gptqmodels_path(defuser, host):  # noqa: F811
    """Rows that are not whole samples (some module chose them) outside qlink's loop; whole
    samples' tokens flattened (a shared expert's input) split into the samples."""
    from gptqmodel.looper import gptq_processor
    from gptqmodel.quantization import config
    adapter.install(ctx=host, strict=True)
    _looper(_capture()).loop(0)
    g = gptq_processor.GPTQ(torch.nn.Linear(HIDDEN, 8, bias=False), config.QuantizeConfig())
    g.name = "mlp.experts.0.up_proj"
    with pytest.raises(FallbackRefused, match="mlp.experts.0.up_proj.*grouped forward's 40-row input whose "
                                              "samples' rows are not known"):
        g.add_batch(torch.randn(40, HIDDEN), None)
    g.name = "mlp.shared_expert.up_proj"
    g.add_batch(torch.randn(4 * SEQ, HIDDEN), None)
    adapter.flush_hessians()
    assert g.nsamples == 4 * SEQ and adapter.counters()["seams"]["add_batch"]["qlink"] == 1


def test_a_failing_sort_runs_defusers_loop(defuser, host, monkeypatch):  # noqa: F811
    def broken(*args):
        raise RuntimeError("injected")
    module = experts(defuser)
    hidden, chosen, weights = routing(SEQ, seed=2)
    theirs = module(hidden, chosen, weights)
    monkeypatch.setattr(defuser_moe, "_plan", broken)
    adapter.install(ctx=host)
    assert torch.equal(module(hidden, chosen, weights), theirs)
    assert adapter.counters()["seams"]["routed_experts"]["reasons"] == {"RuntimeError: injected": 1}


def test_with_expert_stage_an_unwatched_forward_takes_the_grouped_gemms(defuser, host, monkeypatch):  # noqa: F811
    """expert_stage (the default): a forward no hook watches runs the experts as grouped GEMMs (here
    torch._grouped_mm stood in for by a per-group loop, float64): the loop's output, counted;
    a hooked expert keeps the loop, bit for bit, the reason counted."""
    from qlink.integrations import grouped_experts
    from test_integration_autoround_grouped_moe import _grouped_mm_by_loop
    monkeypatch.setattr(torch, "_grouped_mm", _grouped_mm_by_loop, raising=False)
    monkeypatch.setattr(grouped_experts, "fits", lambda x: True)
    module = experts(defuser).double()
    hidden, chosen, weights = routing(3 * SEQ, seed=1)
    hidden, weights = hidden.double(), weights.double()
    adapter.install(ctx=host, strict=True, expert_stage=False)
    looped = module(hidden, chosen, weights)
    adapter.install(ctx=host, strict=True, expert_stage=True)
    torch.testing.assert_close(module(hidden, chosen, weights), looped, rtol=1e-12, atol=1e-12)
    assert adapter.counters()["seams"]["grouped_replay"]["qlink"] == 1
    module[2].up_proj.register_forward_hook(lambda m, inp, out: None)
    assert torch.equal(module(hidden, chosen, weights), looped)
    assert adapter.counters()["seams"]["grouped_replay"]["reasons"] == {"expert 2.up_proj is hooked": 1}
