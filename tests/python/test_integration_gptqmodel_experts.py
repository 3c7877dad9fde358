"""qlink's owned MoE expert stage (the expert_stage seam over the stand-in GPTQModel's
run_subset_stage, and its pieces) on the CPU backend: the layer's expert subsets through
qlink equal GPTQModel's own path (block outputs bit for bit, per-expert Hessians within fp32
rounding of a sum's order, row counts, which experts no token reached, the solved codes);
a fused block (transformers 5's 3-D experts) gives what its defused copy gives, without per-
expert modules; chunked Hessians, and Hessians placed off the rows' device, equal one chunk's;
the experts placed over GPTQModel's GPUs in ranges, its hints kept;
what the stage does not cover runs GPTQModel's stage with the reason named."""
import copy
import dataclasses
import importlib
import os
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel import expert_hessians, expert_placement, expert_stage
from qlink.integrations.gptqmodel.expert_layout import ExpertWeights, refusal
from qlink.integrations.gptqmodel.expert_pass import ExpertPass
from qlink.integrations.patches import FallbackRefused
from qlink.quant import HessianAccumulator

from stand_in_hosts import stand_in
from test_defuser_standin import Config, Experts, defuser  # noqa: F401 (the fixture)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
import common as bench_common  # noqa: E402 (bench/hosts: gptqmodel_run.py's --host-hessians)

HIDDEN, INTER, EXPERTS, TOP_K, SEQ, BATCHES = 32, 24, 8, 2, 16, 4


def bench_script(name):
    """A bench/hosts script imported with sys.path as it was: gptqmodel_run.py puts the
    packed folder's paths (the stand-ins' among them) first as it loads."""
    saved = list(sys.path)
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        yield qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library)


class Block(nn.Module):
    """An MoE block as transformers' (router, softmax, top-k, renormalised) whose last
    expert no token is routed to."""

    def __init__(self, experts, router):
        super().__init__()
        self.experts, self.router = experts, router

    def forward(self, hidden_states):
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        logits = self.router(flat)
        logits[:, -1] = -float("inf")
        weights, chosen = torch.topk(F.softmax(logits, dim=-1), TOP_K, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return self.experts(flat, chosen, weights).reshape(hidden_states.shape)


class Layer(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.mlp = block

    def forward(self, hidden_states, **kwargs):
        return (hidden_states + self.mlp(hidden_states),)


def fused_layer(seed=0):
    gen = torch.Generator().manual_seed(seed)
    experts = Experts(Config(hidden=HIDDEN, inter=INTER, experts=EXPERTS, top_k=TOP_K))
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(experts.gate_up_proj.shape, generator=gen) / 4)
        experts.down_proj.copy_(torch.randn(experts.down_proj.shape, generator=gen) / 4)
    router = nn.Linear(HIDDEN, EXPERTS, bias=False)
    router.weight.data = torch.randn(EXPERTS, HIDDEN, generator=gen)
    return Layer(Block(experts, router))


def defused(layer, defuser):  # noqa: F811
    """The layer with its experts split as defuser splits them (copies of the slices)."""
    split = copy.deepcopy(layer)
    fused = split.mlp.experts
    split.mlp.experts = defuser.DefusedExperts([
        defuser.DefusedExpert(fused.gate_up_proj[e, :INTER], fused.gate_up_proj[e, INTER:], fused.down_proj[e],
                              fused.act_fn) for e in range(EXPERTS)])
    return split


def batches(seed=1):
    """The calibration batches: one sample of SEQ tokens each."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, SEQ, HIDDEN, generator=gen) for _ in range(BATCHES)]


def cache(dtype=torch.float32):
    from gptqmodel.looper.input_cache import InputCache
    return InputCache([[x.to(dtype)] for x in batches()], [{} for _ in range(BATCHES)], [], [None] * BATCHES)


class SharedExpert(nn.Module):
    """An always-on expert beside the routed ones (DeepSeek's shared_experts)."""

    def __init__(self, seed=2):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.gate_proj, self.up_proj = (nn.Linear(HIDDEN, INTER, bias=False) for _ in range(2))
        self.down_proj = nn.Linear(INTER, HIDDEN, bias=False)
        for linear in (self.gate_proj, self.up_proj, self.down_proj):
            linear.weight.data = torch.randn(linear.weight.shape, generator=gen) / 4

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SharedBlock(Block):
    def __init__(self, block):
        super().__init__(block.experts, block.router)
        self.shared_experts = SharedExpert()

    def forward(self, hidden_states):
        return super().forward(hidden_states) + self.shared_experts(hidden_states)


def subsets(layer, processor):
    """GPTQModel's two expert subsets of the layer (gate/up, then down) as plans, each
    module's task made by the processor; a shared expert's linears in the subset of their
    projection, after the routed experts', as GPTQModel's DeepSeek definition puts them."""
    from gptqmodel.looper.named_module import NamedModule
    from gptqmodel.looper.stage_subset import SubsetPlan
    plans = []
    shared = ["mlp.shared_experts"] if hasattr(layer.mlp, "shared_experts") else []
    for projections in (("gate_proj", "up_proj"), ("down_proj",)):
        modules = {}
        for proj in projections:
            for path in ["mlp.experts.%d" % e for e in range(EXPERTS)] + shared:
                name = "%s.%s" % (path, proj)
                modules[name] = NamedModule(layer.get_submodule(name), name, "model.layers.0." + name, 0)
                processor.preprocess(modules[name])
        plans.append(SubsetPlan(modules, len(plans), 2, True, True, BATCHES, [modules]))
    return plans


def run_layer(layer, monkeypatch, qcfg=None):
    """The layer's expert subsets through the stand-in's layer stage on batches of the layer's
    dtype (qcfg: the processor's QuantizeConfig, its tasks' quantizers configured per channel); returns each task's
    (Hessian, rows) as its solve found them, the solves' results, the dynamic exclusions."""
    from gptqmodel.looper import gptq_processor, stage_layer
    seen, process = {}, gptq_processor.GPTQProcessor.process

    def recording(processor, module):
        task = processor.tasks[module.name]
        seen[module.name] = (task.finalize_hessian().clone(), task.nsamples)
        return process(processor, module)
    monkeypatch.setattr(gptq_processor.GPTQProcessor, "process", recording)
    processor = gptq_processor.GPTQProcessor(qcfg)
    plans = subsets(layer, processor)
    for task in processor.tasks.values() if qcfg is not None else ():
        task.quantizer.configure(perchannel=True)  # as GPTQModel configures it: the engine covers the tasks
    looper = type("Looper", (), {"gptq_model": _model()})()
    dtype = next(layer.parameters()).dtype
    stage_layer.run_layer_stage(looper, plans=plans, processor=processor, module=layer, cache=cache(dtype),
                                layer_index=0)
    return seen, processor.results, processor.qcfg.dynamic


def _model():
    from gptqmodel.models.base import BaseQModel
    return type("Qwen3MoeQModel", (BaseQModel,), {"dynamic_expert_index": "num_experts"})()


def test_the_stage_drops_the_layers_copies_of_the_experts_it_owns(host, defuser, monkeypatch):  # noqa: F811
    adapter.install(ctx=host, strict=True, expert_stage=True)
    dropped = []
    monkeypatch.setattr(adapter._integration.current.prefetch, "drop_kept", lambda modules: dropped.append(modules))
    run_layer(copy.deepcopy(defused(fused_layer(), defuser)), monkeypatch)
    gate_up, down = dropped
    assert sorted(gate_up) == sorted("mlp.experts.%d.%s" % (e, p) for e in range(EXPERTS) for p in ("gate_proj",
                                                                                                    "up_proj"))
    assert sorted(down) == sorted("mlp.experts.%d.down_proj" % e for e in range(EXPERTS))


def test_the_stage_moves_its_tasks_quantizers_in_one_move(host, defuser, monkeypatch):  # noqa: F811
    adapter.install(ctx=host, strict=True, expert_stage=True)
    moves, move = [], host.move_module_to_device
    monkeypatch.setattr(host, "move_module_to_device", lambda m, d: moves.append(len(list(m.children()))) or move(m, d))
    run_layer(copy.deepcopy(defused(fused_layer(), defuser)), monkeypatch)
    assert moves == [2 * EXPERTS, EXPERTS]  # gate/up's, then down's


def test_the_owned_stage_gives_gptqmodels_hessians_counts_and_exclusions(host, defuser, monkeypatch):  # noqa: F811
    """GPTQModel's own path (qlink not installed: its hooks and add_batch per expert) against
    qlink's stage: the gate/up Hessians (GPTQModel's own solve in both) within the rounding
    of a sum's order, the rows equal, the never-routed expert pruned in both."""
    layer = defused(fused_layer(), defuser)
    theirs, _, their_dynamic = run_layer(copy.deepcopy(layer), monkeypatch)
    adapter.install(ctx=host, strict=True, expert_stage=True)
    mine, _, my_dynamic = run_layer(copy.deepcopy(layer), monkeypatch)
    counts = adapter.counters()
    assert counts["seams"]["expert_stage"]["qlink"] == 2
    assert my_dynamic == their_dynamic and len(my_dynamic) == 3  # expert 7's gate, up and down
    gate_up = [k for k in theirs if not k.endswith("down_proj")]
    assert sorted(mine) == sorted(theirs) and len(gate_up) == 2 * (EXPERTS - 1)
    for name in theirs:
        (h, rows), (other, other_rows) = theirs[name], mine[name]
        assert rows == other_rows, name
        tolerance = 1e-5 if name in gate_up else 2e-2  # down reads the solved gate/up, solved apart
        torch.testing.assert_close(other, h, rtol=tolerance, atol=tolerance, msg=name)
    seconds = {key: counts["experts"].pop(key) for key in ("forwards_s", "solved_s")}
    assert counts["experts"] == {"blocks": 2, "experts": 2 * EXPERTS, "empty": 2, "few": 0,
                                 "rows": 2 * BATCHES * SEQ * TOP_K, "chunks": 2,
                                 "placed": 0}
    assert seconds["forwards_s"] > 0 and seconds["solved_s"] > 0


def test_on_gptqmodels_arithmetic_the_stage_gives_its_hessians_bit_for_bit(host, defuser, monkeypatch):  # noqa: F811
    """bench/hosts/common.host_hessians (gptqmodel_run.py --host-hessians: GPTQModel's per-batch
    products under the stage, its merge) on a bf16 layer: every expert's Hessian, gate/up's and
    down's, is GPTQModel's own path's bit for bit, and the codes equal: the stage's rows, their
    order, its forwards and counts are the host's. (The CPU backend's products are IEEE fp32
    in that order anyway; on a GPU they are not, and this mode takes them out of a comparison.)"""
    layer = defused(fused_layer(), defuser).to(torch.bfloat16)
    theirs, their_results, _ = run_layer(copy.deepcopy(layer), monkeypatch)
    adapter.install(ctx=host, strict=True, expert_stage=True)
    bench_common.host_hessians(adapter._integration.current)
    mine, my_results, _ = run_layer(copy.deepcopy(layer), monkeypatch)
    counts = adapter.counters()
    assert counts["seams"]["expert_stage"]["qlink"] == 2 and counts["experts"]["experts"] == 2 * EXPERTS
    assert counts["hessians"]["calls"] == 0  # no product of qlink's accumulator: all GPTQModel's arithmetic
    assert sorted(mine) == sorted(theirs)
    for name in theirs:
        assert torch.equal(mine[name][0], theirs[name][0]) and mine[name][1] == theirs[name][1], name
        assert torch.equal(my_results[name][0], their_results[name][0]), name


def test_host_solves_gives_the_matching_tasks_gptqmodels_solve(host, defuser, monkeypatch):  # noqa: F811
    """bench/hosts/common.host_solves (gptqmodel_run.py --host-solves): the tasks whose name
    matches solve by GPTQModel's own quantize, the others by qlink's engine, each result its
    path's; the experts' Hessians stay the stage's."""
    from gptqmodel.quantization import gptq as host_gptq
    from gptqmodel.quantization.config import QuantizeConfig
    layer, qcfg = defused(fused_layer(), defuser), QuantizeConfig(group_size=8)  # one the engine covers
    host_solved = []
    quantize = host_gptq.GPTQ.quantize

    def recorded(gptq, *args, **kwargs):
        host_solved.append(gptq.name)
        return quantize(gptq, *args, **kwargs)
    monkeypatch.setattr(host_gptq.GPTQ, "quantize", recorded)
    adapter.install(ctx=host, strict=True, expert_stage=True)
    bench_common.host_solves(adapter._integration.current, r"experts\.[01]\.")
    _, results, _ = run_layer(copy.deepcopy(layer), monkeypatch, qcfg)
    matching = sorted(n for n in results if re.search(r"experts\.[01]\.", n))
    assert len(matching) == 6 and sorted(host_solved) == matching
    assert adapter.counters()["solves"]["layers"] == len(results) - len(matching)


def test_the_stage_is_the_default_and_expert_stage_false_leaves_gptqmodels(host, defuser, monkeypatch):  # noqa: F811
    """install() runs the stage unless told expert_stage=False, which leaves every subset to
    GPTQModel's stage, counted."""
    adapter.install(ctx=host, strict=True)
    run_layer(defused(fused_layer(), defuser), monkeypatch)
    assert adapter.counters()["seams"]["expert_stage"]["qlink"] == 2
    adapter.install(ctx=host, strict=True, expert_stage=False)
    run_layer(defused(fused_layer(), defuser), monkeypatch)
    counts = adapter.counters()
    assert counts["seams"]["expert_stage"]["qlink"] == 0
    assert counts["seams"]["expert_stage"]["reasons"] == {"expert_stage=False": counts["seams"]["expert_stage"]["host"]}
    assert counts["experts"]["blocks"] == 0
    with pytest.raises(ValueError, match="expert_stage must be True or False, got 'yes'"):
        adapter.install(ctx=host, expert_stage="yes")


def test_the_owned_stage_solves_what_gptqmodels_forwards_would(host, defuser, monkeypatch):  # noqa: F811
    """Both through qlink (its add_batch and engine), GPTQModel's forwards against the owned
    stage: every Hessian, gate/up's and down's, within a sum's rounding, codes equal; each
    subset's solves in one engine call, as after GPTQModel's forwards."""
    from gptqmodel.quantization.config import QuantizeConfig
    layer, qcfg = defused(fused_layer(), defuser), QuantizeConfig(group_size=8)  # one the engine covers
    adapter.install(ctx=host, strict=True, expert_stage=True)
    monkeypatch.setattr(expert_stage, "expert_subset", lambda names: (None, "off for the reference"))
    theirs, their_results, _ = run_layer(copy.deepcopy(layer), monkeypatch, qcfg)
    monkeypatch.undo()
    before = adapter.counters()["solves"]
    mine, my_results, _ = run_layer(copy.deepcopy(layer), monkeypatch, qcfg)
    assert adapter.counters()["seams"]["expert_stage"]["qlink"] == 2
    solves = {k: v - before[k] for k, v in adapter.counters()["solves"].items()}
    assert solves["calls"] == 2 and solves["layers"] == 3 * (EXPERTS - 1)  # one engine call a subset
    for name in theirs:
        torch.testing.assert_close(mine[name][0], theirs[name][0], rtol=1e-5, atol=1e-5, msg=name)
        assert mine[name][1] == theirs[name][1], name
    codes = [(my_results[n][0] == their_results[n][0]).float().mean().item() for n in theirs]
    assert min(codes) >= 0.99, codes


class Recorded:
    """A pass's sink that keeps what the pass does not: each forward's rows and counts."""

    def __init__(self):
        self.forwards = []

    def __call__(self, rows, counts):
        self.forwards.append((rows.clone(), list(counts)))

    def rows(self, expert):
        """Expert's rows of every forward, in forward order (None: it had none)."""
        parts = []
        for rows, counts in self.forwards:
            start = sum(counts[:expert])
            if counts[expert]:
                parts.append(rows[start:start + counts[expert]])
        return torch.cat(parts) if parts else None


def test_the_pass_gives_defusers_output_bit_for_bit_and_fused_gives_defused(defuser):  # noqa: F811
    fused = fused_layer()
    split = defused(fused, defuser)
    x = batches()[0]
    with torch.no_grad():
        eager = split.mlp(x)
        passes, sinks = {}, {}
        for name, layer in (("fused", fused), ("split", split)):
            sinks[name] = Recorded()
            routed = passes[name] = ExpertPass(ExpertWeights(layer.mlp.experts), "inputs", sinks[name])
            with routed.installed_on(layer.mlp.experts):
                out = layer.mlp(x)
            assert torch.equal(out, eager), name
            assert "forward" not in vars(layer.mlp.experts)
    assert passes["fused"].totals() == passes["split"].totals()
    rows, _ = passes["fused"].totals()
    assert rows[-1] == 0 and sum(rows) == SEQ * TOP_K
    for e in range(EXPERTS - 1):
        assert torch.equal(sinks["fused"].rows(e), sinks["split"].rows(e)), e
    assert sinks["fused"].rows(EXPERTS - 1) is None
    assert not any(isinstance(m, nn.Linear) for m in fused.mlp.experts.modules())


def _forwards(layer, record, count=BATCHES):
    """forwards(sink) for expert_hessians: the layer's block over the first `count` batches."""
    def forwards(sink):
        routed = ExpertPass(ExpertWeights(layer.mlp.experts), record, sink)
        with torch.no_grad(), routed.installed_on(layer.mlp.experts):
            for x in batches()[:count]:
                layer.mlp(x)
        return routed.totals()
    return forwards


def _hessians(accumulator, forwards, columns, budget=None, placed=None):
    """({expert: its Hessian}, the count of chunks): the forwards run once a chunk of
    expert_chunks(budget), the experts of `placed` summed where it says."""
    out = {}
    chunks = expert_hessians.expert_chunks(EXPERTS, columns, budget)
    for chunk in chunks:
        sink = expert_hessians.ChunkHessians(accumulator, chunk, placed)
        forwards(sink)
        out.update(sink.partials)
    return out, len(chunks)


def test_the_benchs_stage_row_digests_are_the_host_loops_add_batch_inputs(defuser, monkeypatch):  # noqa: F811
    """gptqmodel_run.record_stage_rows (--batch-digests under --qlink): each forward's rows of
    a matching expert linear in the stage digest as that linear's input in the host's loop
    (defuser's run_routed_experts), one digest a forward it has rows in, so an alone run's and
    a stage run's batch digests compare expert by expert."""
    gptqmodel_run = bench_script("gptqmodel_run")
    from digests import device_checksum, short_digest
    monkeypatch.setattr(ExpertPass, "__init__", ExpertPass.__init__)  # restored after the test
    layer = fused_layer()
    model = nn.ModuleDict({"layers": nn.ModuleList([layer])})
    pattern = r"layers\.0\.mlp\.experts\.[0-2]\.(gate|down)_proj$"
    staged = {}
    gptqmodel_run.record_stage_rows(model, pattern, staged)
    for record in ("inputs", "intermediates"):
        _forwards(layer, record)(lambda rows, counts: None)
    split = defused(layer, defuser)
    fed = {}
    for e in range(3):
        for linear in ("gate_proj", "down_proj"):
            name = "layers.0.mlp.experts.%d.%s" % (e, linear)
            getattr(split.mlp.experts[e], linear).register_forward_pre_hook(
                lambda module, args, name=name: fed.setdefault(name, []).append(device_checksum(args[0])))
    with torch.no_grad():
        for x in batches():
            split.mlp(x)
    assert sorted(staged) == sorted(fed) and len(fed) == 6
    for name in fed:
        assert [short_digest(s) for s in staged[name]] == [short_digest(s) for s in fed[name]], name


@pytest.mark.parametrize("record", ["inputs", "intermediates"])
def test_fused_hessians_equal_defused_and_chunked_equal_one_chunk(host, defuser, record):  # noqa: F811
    """Each expert's Hessian is the sum of its rows' products forward by forward: fused equals
    defused, chunks (each its own run of the forwards) equal one, and so do experts placed off
    the rows' device (their rows gathered and copied there: apart, or one adjacent range)."""
    fused = fused_layer()
    columns = HIDDEN if record == "inputs" else INTER
    accumulator = HessianAccumulator(host)
    whole, _ = _hessians(accumulator, _forwards(fused, record), columns)
    split, _ = _hessians(accumulator, _forwards(defused(fused, defuser), record), columns)
    budget = 2 * 2 * 4 * columns ** 2  # two experts a chunk
    chunked, count = _hessians(HessianAccumulator(host), _forwards(fused, record), columns, budget=budget)
    assert count == EXPERTS // 2
    cpu = torch.device("cpu")
    apart, _ = _hessians(accumulator, _forwards(fused, record), columns, placed={e: cpu for e in (1, 3, 4, 6)})
    ranged, _ = _hessians(accumulator, _forwards(fused, record), columns, placed={e: cpu for e in range(4, EXPERTS)})
    assert sorted(whole) == sorted(split) == sorted(chunked) == sorted(apart) == sorted(ranged) == list(
        range(EXPERTS - 1))
    recorded = Recorded()
    _forwards(fused, record)(recorded)
    for e, h in whole.items():
        expected = sum(rows[sum(counts[:e]):sum(counts[:e + 1])].double().t() @
                       rows[sum(counts[:e]):sum(counts[:e + 1])].double() for rows, counts in recorded.forwards)
        assert all(torch.equal(other[e], h) for other in (split, chunked, apart, ranged)), e
        torch.testing.assert_close(h.double(), expected, rtol=1e-5, atol=1e-5)


def test_chunks_fit_the_budget():
    assert expert_hessians.expert_chunks(5, 4, None) == [[0, 1, 2, 3, 4]]
    # an expert's Hessian takes 4 * 4^2 = 64 bytes, twice over with its inverse: 128
    assert expert_hessians.expert_chunks(5, 4, 256) == [[0, 1], [2, 3], [4]]
    assert expert_hessians.expert_chunks(5, 4, 200) == [[0], [1], [2], [3], [4]]
    # and 3 bytes a weight of its layers: 128 + 3 * 24 = 200
    assert expert_hessians.expert_chunks(5, 4, 400, weights=24) == [[0, 1], [2, 3], [4]]
    assert expert_hessians.expert_chunks(5, 4, 399, weights=24) == [[0], [1], [2], [3], [4]]
    with pytest.raises(ValueError, match=r"expert_budget 100 bytes does not hold one expert's solve \(128"):
        expert_hessians.expert_chunks(5, 4, 100)


def test_a_round_is_each_devices_next_chunk():
    rounds = expert_hessians.expert_rounds
    assert rounds(["a"] * 5, 4, {"a": 256}) == expert_hessians.expert_chunks(5, 4, 256)
    assert rounds(["a"] * 3 + ["b"] * 3, 4, {"a": None, "b": None}) == [[0, 1, 2, 3, 4, 5]]
    # a: two experts a chunk, b: one; each device's experts in order
    assert rounds(["a", "a", "a", "b", "b", "a"], 4, {"a": 256, "b": 128}) == [[0, 1, 3], [2, 4, 5]]
    assert rounds(["a", "b", "c"] * 2, 4, {"a": 128, "b": 128, "c": None}) == [[0, 1, 2, 5], [3, 4]]
    with pytest.raises(ValueError, match="expert_budget 100 bytes"):
        rounds(["a", "b"], 4, {"a": None, "b": 100})


class _Named:
    def __init__(self, hint=None):
        self.state = {} if hint is None else {"preferred_quant_device": hint}


def _placement(devices, count=6, hints=None, home="cuda:0", cpu_memory=False, rooms=None):
    """placed_experts over `count` experts of gate and up each (hints: {expert: a hint on its
    gate}), GPTQModel's quantization devices `devices`, each device's room (default: no
    bound): (placed, each module's hint)."""
    by_expert = {e: ["mlp.experts.%d.gate_proj" % e, "mlp.experts.%d.up_proj" % e] for e in range(count)}
    modules = {name: _Named((hints or {}).get(e) if name.endswith("gate_proj") else None)
               for e, names in by_expert.items() for name in names}
    looper = type("Looper", (), {"_quant_devices": [torch.device(d) for d in devices]})()
    ctx = type("Context", (), {"device_count": 4, "cpu_memory": cpu_memory})()
    plan = type("Plan", (), {"modules": modules})()
    placed = expert_placement.placed_experts(looper, plan, by_expert, torch.device(home), ctx,
                                             lambda device: (rooms or {}).get(str(device)))
    return placed, {name: str(m.state.get("preferred_quant_device")) for name, m in modules.items()}


def test_experts_are_placed_over_gptqmodels_gpus_in_ranges_home_first():
    placed, hints = _placement(["cuda:1", "cuda:0", "cuda:2"], count=7)
    cuda = [torch.device("cuda", i) for i in range(3)]
    # home (cuda:0) first, then GPTQModel's order: 3, 2 and 2 experts; home's are not "placed"
    assert placed == {3: cuda[1], 4: cuda[1], 5: cuda[2], 6: cuda[2]}
    expected = ["cuda:0"] * 3 + ["cuda:1"] * 2 + ["cuda:2"] * 2
    assert [hints["mlp.experts.%d.%s" % (e, p)] for p in ("gate_proj", "up_proj") for e in range(7)] == expected * 2
    # a hint of GPTQModel's own (its balanced MoE strategy) is kept for the whole expert
    placed, hints = _placement(["cuda:0", "cuda:1"], count=4, hints={0: "cuda:1", 3: "cuda:0"})
    assert placed == {0: cuda[1], 2: cuda[1]}
    assert hints["mlp.experts.0.up_proj"] == "cuda:1" and hints["mlp.experts.3.up_proj"] == "cuda:0"
    # one GPU, GPUs qlink's context lacks, or the CPU backend: nothing placed, no hint written
    for devices, cpu_memory in ((["cuda:0"], False), (["cuda:0", "cuda:7"], False), (["cpu"], False),
                                (["cuda:0", "cuda:1"], True)):
        placed, hints = _placement(devices, cpu_memory=cpu_memory)
        assert placed == {} and set(hints.values()) == {"None"}, devices


def test_each_gpus_range_follows_its_room_and_a_full_gpu_gets_none():
    cuda = [torch.device("cuda", i) for i in range(3)]
    # rooms 2, 6 and 4 experts a round: 12 experts in shares 2, 6 and 4 (one round each)
    placed, _ = _placement(["cuda:0", "cuda:1", "cuda:2"], count=12, rooms={"cuda:0": 2, "cuda:1": 6, "cuda:2": 4})
    assert placed == dict([(e, cuda[1]) for e in range(2, 8)] + [(e, cuda[2]) for e in range(8, 12)])
    # cuda:1 holds no expert's solve: left out; cuda:2 takes every expert home has no room for
    placed, hints = _placement(["cuda:0", "cuda:1", "cuda:2"], count=5, rooms={"cuda:0": 1, "cuda:1": 0, "cuda:2": 3})
    assert placed == {e: cuda[2] for e in range(1, 5)} and "cuda:1" not in hints.values()
    # only home left: nothing placed
    assert _placement(["cuda:0", "cuda:1"], rooms={"cuda:0": 1, "cuda:1": 0})[0] == {}


def test_shares_add_up_by_largest_remainder():
    shares = expert_placement.shares
    assert shares(7, [None, 3]) == [4, 3] and shares(7, [0, 0]) == [4, 3]
    assert shares(10, [1, 1, 1]) == [4, 3, 3]
    assert shares(10, [5, 3, 2]) == [5, 3, 2] and shares(5, [2, 1]) == [3, 2]  # 3.33 and 1.67: the larger remainder
    assert all(sum(shares(n, [3, 7, 1])) == n for n in range(40))


def _plan_case(case, layer, processor):
    from gptqmodel.looper.gptq_processor import GPTQProcessor
    from gptqmodel.looper.named_module import NamedModule
    if case == "processor":
        processor = type("AWQProcessor", (GPTQProcessor,), {})()
    plan = subsets(layer, processor)[0]
    if case == "no_replay":
        return processor, dataclasses.replace(plan, replay_after_process=False)
    if case == "chunks":
        names = list(plan.modules)
        return processor, dataclasses.replace(plan, module_chunks=[{n: plan.modules[n]} for n in names[:2]])
    if case == "bias":
        layer.mlp.experts[0].gate_proj.bias = nn.Parameter(torch.zeros(INTER))
    if case == "dense":
        router = NamedModule(layer.mlp.router, "mlp.router", "model.layers.0.mlp.router", 0)
        processor.preprocess(router)
        return processor, plan.for_modules({"mlp.router": router})
    return processor, plan


@pytest.mark.parametrize("case, reason", [
    ("processor", "a AWQProcessor processor"),
    ("no_replay", "the subset's forward outputs are the next layer's inputs (no replay after process)"),
    ("chunks", "the subset runs in module chunks (MoE routing bypass)"),
    ("bias", "expert 0's gate_proj is not a Linear without bias"),
    ("dense", "not an MoE expert subset"),
    ("routing", "MoE routing options"),
])
def test_what_the_stage_does_not_cover_runs_gptqmodels_stage_named(host, defuser, case, reason):  # noqa: F811
    from gptqmodel.looper import gptq_processor, stage_layer
    adapter.install(ctx=host, strict=True, expert_stage=True)
    layer = defused(fused_layer(), defuser)
    processor = gptq_processor.GPTQProcessor()
    processor, plan = _plan_case(case, layer, processor)
    looper = type("Looper", (), {"gptq_model": _model(), "moe_routing_bypass": case == "routing"})()
    data = cache()
    stage_layer.run_subset_stage(looper, plan=plan, processor=processor, module=layer,
                                 layer_inputs=data.layer_inputs, layer_input_kwargs=data.layer_input_kwargs,
                                 position_ids=data.position_ids, attention_masks=data.attention_masks,
                                 cur_layer_device=torch.device("cpu"), layer_index=0)
    said = adapter.counters()["seams"]["expert_stage"]
    assert said["qlink"] == 0 and list(said["reasons"]) == [reason]


def test_a_failing_pass_falls_back_for_the_whole_block(host, defuser, monkeypatch):  # noqa: F811
    from gptqmodel.looper import gptq_processor, stage_layer

    def broken(rows, counts):
        raise RuntimeError("injected")
    monkeypatch.setattr(expert_stage, "ChunkHessians", lambda *args: broken)
    for strict in (False, True):
        adapter.install(ctx=host, strict=strict, expert_stage=True)
        layer = defused(fused_layer(), defuser)
        processor = gptq_processor.GPTQProcessor()
        (plan, _), data = subsets(layer, processor), cache()
        looper = type("Looper", (), {"gptq_model": _model()})()
        args = dict(plan=plan, processor=processor, module=layer, layer_inputs=data.layer_inputs,
                    layer_input_kwargs=data.layer_input_kwargs, position_ids=data.position_ids,
                    attention_masks=data.attention_masks, cur_layer_device=torch.device("cpu"), layer_index=0)
        if strict:
            with pytest.raises(FallbackRefused, match="expert_stage.*RuntimeError: injected"):
                stage_layer.run_subset_stage(looper, **args)
            continue
        result = stage_layer.run_subset_stage(looper, **args)
        assert len(result.processed_subset) == 2 * (EXPERTS - 1)  # GPTQModel's forward fed every task
        assert adapter.counters()["seams"]["expert_stage"]["reasons"] == {"RuntimeError: injected": 1}


def test_layouts_the_stage_does_not_read_are_named():
    experts = Experts(Config(hidden=HIDDEN, inter=INTER, experts=EXPERTS, top_k=TOP_K))
    assert refusal(experts) is None
    experts.has_bias = True
    assert refusal(experts) == "fused experts with a bias or a transposed layout"
    assert refusal(nn.Linear(2, 2)) == "experts that are neither split per expert nor fused (Linear)"
    with pytest.raises(ValueError, match=r"experts: experts that are neither split per expert nor fused \(Linear\)"):
        ExpertWeights(nn.Linear(2, 2))


def test_hooked_linears_are_read_and_rotated_inputs_refused(defuser):  # noqa: F811
    class HookedLinear(nn.Linear):  # GPTQModel's: an nn.Linear subclass with a forward hook and Hadamard flags
        forward_hook, online_full_had, online_partial_had = None, False, False

    split = defused(fused_layer(), defuser).mlp.experts
    for expert in split:
        for name in ("gate_proj", "up_proj", "down_proj"):
            linear = getattr(expert, name)
            hooked = HookedLinear(linear.in_features, linear.out_features, bias=False)
            hooked.weight = linear.weight
            setattr(expert, name, hooked)
    assert refusal(split) is None
    split[3].up_proj.online_partial_had = True
    assert refusal(split) == "expert 3's up_proj rotates its input (online Hadamard)"


def test_only_modules_not_on_the_layers_device_are_filled_again():
    filled = []
    looper = type("Looper", (), {"_prepare_named_module_for_forward": lambda self, named_module, fallback_device:
                                 filled.append((named_module.name, fallback_device))})()
    named = [type("Named", (), {"name": n, "module": nn.Linear(2, 2, bias=False, device=d)})()
             for n, d in (("on_cpu", "cpu"), ("shell", "meta"))]
    plan = type("Plan", (), {"modules": {n.name: n for n in named}})()
    expert_stage._fill(looper, plan, torch.device("cpu"))
    assert filled == [("shell", torch.device("cpu"))]


def test_chunks_are_solved_before_the_next_chunks_hessians_as_one_chunk(host, defuser, monkeypatch):  # noqa: F811
    """With a budget that splits the experts into chunks, each chunk's tasks are solved
    (GPTQModel's stage over the chunk's modules) before the next chunk's Hessians are made;
    every Hessian, row count, result and exclusion equals the one-chunk run's."""
    from gptqmodel.looper import gptq_processor
    layer = defused(fused_layer(), defuser)
    adapter.install(ctx=host, strict=True, expert_stage=True)
    whole, whole_results, whole_dynamic = run_layer(copy.deepcopy(layer), monkeypatch)
    events, made, process = [], expert_stage.ChunkHessians, gptq_processor.GPTQProcessor.process

    def hessians(accumulator, chunk, *args):
        events.append(("hessians", list(chunk)))
        return made(accumulator, chunk, *args)
    monkeypatch.setattr(expert_stage, "ChunkHessians", hessians)
    monkeypatch.setattr(gptq_processor.GPTQProcessor, "process",
                        lambda self, module: events.append(("solve", module.name)) or process(self, module))
    adapter.install(ctx=host, strict=True, expert_stage=True, expert_budget=13000)
    chunked, chunked_results, chunked_dynamic = run_layer(copy.deepcopy(layer), monkeypatch)
    made_at = [i for i, (kind, _) in enumerate(events) if kind == "hessians"]
    assert len(made_at) >= 5 and adapter.counters()["experts"]["chunks"] == len(made_at)
    for at, following in zip(made_at, made_at[1:] + [len(events)]):  # a chunk's solves, then the next chunk
        experts = {"%d" % e for e in events[at][1] if e != EXPERTS - 1}  # the last: no token, pruned
        solved = {name.split(".")[-2] for kind, name in events[at + 1:following]}
        assert experts <= solved, (events[at], events[at + 1:following])
    assert chunked_dynamic == whole_dynamic and sorted(chunked) == sorted(whole)
    for name in whole:
        assert torch.equal(chunked[name][0], whole[name][0]) and chunked[name][1] == whole[name][1], name
        assert all(torch.equal(a, b) if torch.is_tensor(a) else True
                   for a, b in zip(chunked_results[name], whole_results[name])), name


def test_placed_experts_give_what_the_rows_device_gives(host, defuser, monkeypatch):  # noqa: F811
    """Experts the stage places off the rows' device (here: the CPU as another device) are
    summed there in every round and give every Hessian, row count, result and exclusion of
    the unplaced run; counters() says how many were placed."""
    layer = defused(fused_layer(), defuser)
    adapter.install(ctx=host, strict=True, expert_stage=True, expert_budget=13000)
    whole, whole_results, whole_dynamic = run_layer(copy.deepcopy(layer), monkeypatch)
    placed_by, made = [], expert_stage.ChunkHessians

    def recording(accumulator, chunk, placed):
        placed_by.append(placed)
        return made(accumulator, chunk, placed)
    monkeypatch.setattr(expert_stage, "ChunkHessians", recording)
    monkeypatch.setattr(expert_stage, "placed_experts", lambda looper, plan, by_expert, home, ctx, room: {
        e: torch.device("cpu") for e in by_expert if e % 2})
    adapter.install(ctx=host, strict=True, expert_stage=True, expert_budget=13000)
    placed, placed_results, placed_dynamic = run_layer(copy.deepcopy(layer), monkeypatch)
    assert len(placed_by) >= 5 and all(sorted(p) == [1, 3, 5, 7] for p in placed_by)
    assert adapter.counters()["experts"]["placed"] == 2 * EXPERTS // 2  # both subsets
    assert placed_dynamic == whole_dynamic and sorted(placed) == sorted(whole)
    for name in whole:
        assert torch.equal(placed[name][0], whole[name][0]) and placed[name][1] == whole[name][1], name
        assert all(torch.equal(a, b) if torch.is_tensor(a) else True
                   for a, b in zip(placed_results[name], whole_results[name])), name


def test_a_later_chunk_that_fails_leaves_the_rest_to_gptqmodels_forwards(host, defuser, monkeypatch):  # noqa: F811
    made, calls = expert_stage.ChunkHessians, []

    def failing_third(accumulator, chunk, *args):
        calls.append(chunk)
        if len(calls) == 3:
            def broken(rows, counts):
                raise RuntimeError("injected")
            return broken
        return made(accumulator, chunk, *args)
    monkeypatch.setattr(expert_stage, "ChunkHessians", failing_third)
    layer = defused(fused_layer(), defuser)
    adapter.install(ctx=host, strict=True, expert_stage=True, expert_budget=13000)
    with pytest.raises(FallbackRefused, match="expert_stage.*RuntimeError: injected"):
        run_layer(copy.deepcopy(layer), monkeypatch)
    calls.clear()
    adapter.install(ctx=host, strict=False, expert_stage=True, expert_budget=13000)
    mine, _, _ = run_layer(copy.deepcopy(layer), monkeypatch)
    assert len(mine) == 3 * (EXPERTS - 1)  # every routed expert's tasks solved, the last after GPTQModel's forwards
    assert adapter.counters()["seams"]["expert_stage"]["reasons"] == {"RuntimeError: injected": 1}


def test_a_shared_expert_in_the_subsets_is_fed_by_gptqmodels_forward(host, defuser, monkeypatch):  # noqa: F811
    """DeepSeek's subsets hold the shared expert's linears beside the routed experts': the
    stage owns the routed ones and GPTQModel's forward feeds the shared one; every Hessian
    and row count equals GPTQModel's path's (both through qlink's add_batch)."""
    layer = defused(fused_layer(), defuser)
    layer.mlp = SharedBlock(layer.mlp)
    adapter.install(ctx=host, strict=True, expert_stage=True)
    monkeypatch.setattr(expert_stage, "expert_subset", lambda names: (None, "off for the reference"))
    theirs, _, their_dynamic = run_layer(copy.deepcopy(layer), monkeypatch)
    monkeypatch.undo()
    mine, _, my_dynamic = run_layer(copy.deepcopy(layer), monkeypatch)
    assert adapter.counters()["seams"]["expert_stage"]["qlink"] == 2
    shared = [name for name in theirs if name.startswith("mlp.shared_experts.")]
    assert len(shared) == 3 and sorted(mine) == sorted(theirs) and my_dynamic == their_dynamic
    for name in theirs:
        torch.testing.assert_close(mine[name][0], theirs[name][0], rtol=1e-5, atol=1e-5, msg=name)
        assert mine[name][1] == theirs[name][1], name


@pytest.mark.parametrize("record", ["inputs", "intermediates"])
def test_the_grouped_pass_is_the_loops_rows_and_sums(defuser, record, monkeypatch):  # noqa: F811
    """The pass's grouped path with torch._grouped_mm stood in for by a per-group loop
    (float64, the CPU): output, counts and kept rows the loop's; split experts stacked give
    the fused block's."""
    from qlink.integrations import grouped_experts
    from test_integration_autoround_grouped_moe import _grouped_mm_by_loop
    monkeypatch.setattr(torch, "_grouped_mm", _grouped_mm_by_loop, raising=False)
    fused = fused_layer().double()
    results = {}
    for name, layer, grouped in (("loop", fused, False), ("fused", fused, True),
                                 ("split", defused(fused, defuser), True)):
        monkeypatch.setattr(grouped_experts, "fits", lambda x, grouped=grouped: grouped)
        sink = Recorded()
        routed = ExpertPass(ExpertWeights(layer.mlp.experts), record, sink)
        with torch.no_grad(), routed.installed_on(layer.mlp.experts):
            outs = [layer.mlp(x.double()) for x in batches()]
        assert (routed.grouped is not None) == grouped, name
        results[name] = (outs, routed, sink)
    for name in ("fused", "split"):
        outs, routed, sink = results[name]
        assert routed.totals() == results["loop"][1].totals()
        for mine, theirs in zip(outs, results["loop"][0]):
            torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
        for e in range(EXPERTS - 1):
            torch.testing.assert_close(sink.rows(e), results["loop"][2].rows(e), rtol=1e-12, atol=1e-12)
