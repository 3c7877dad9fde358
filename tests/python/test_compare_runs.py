"""bench/hosts/compare_runs.py, which says where repeated runs part: the first differing
batch input of a digested layer, per layer how many distinct losses, damps, weights, Hessians
and outputs the runs gave, what of each Hessian a solve's order and damp read (its diagonal's
ties within a group, whether PyTorch's fp32 mean of it is the exact one), and the first call
of a digested module where they part and in what (digests.record_calls, gptqmodel_run.py
--call-digests, records those calls)."""
import os
import sys

import numpy
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
import compare_runs  # noqa: E402 (bench/hosts)
import digests  # noqa: E402 (bench/hosts)


def run(o_proj_loss, o_proj_hessian, o_proj_batches, digest, o_proj_output="q", o_proj_damp=0.01):
    return {"digest": digest, "losses": {"q_proj": 1.0, "o_proj": o_proj_loss},
            "damps": {"q_proj": 0.01, "o_proj": o_proj_damp},
            "input_digests": {"q_proj": {"weight": "w", "hessian": "h"},
                              "o_proj": {"weight": "w", "hessian": o_proj_hessian}},
            "solve_digests": {"q_proj": "q", "o_proj": o_proj_output},
            "batch_digests": {"o_proj": o_proj_batches}}


def test_a_run_whose_forward_parted_is_named_at_its_first_differing_batch():
    same = run(2.0, "a", ["x0", "x1", "x2"], "d1")
    parted = run(2.5, "b", ["x0", "y1", "y2"], "d2", o_proj_output="r", o_proj_damp=0.0115)
    report = compare_runs.compare([same, same, parted])
    assert report["q_proj"] == {"losses": 1, "damps": 1, "weights": 1, "hessians": 1, "outputs": 1}  # no batches
    assert report["o_proj"] == {"losses": 2, "damps": 2, "weights": 1, "hessians": 2, "outputs": 2, "first_batch": 1}


def test_equal_inputs_with_a_differing_hessian_point_at_the_accumulation():
    report = compare_runs.compare([run(2.0, "a", ["x0"], "d1"), run(2.1, "b", ["x0"], "d2")])
    assert report["o_proj"]["first_batch"] is None and report["o_proj"]["hessians"] == 2


def test_agreement_counts_the_solves_whose_weight_hessian_and_output_every_run_shared():
    report = compare_runs.compare([run(2.0, "a", ["x0"], "d1"), run(2.1, "b", ["x0"], "d2", o_proj_output="r")])
    assert compare_runs.agreement(report) == {"solves": 2, "weights": 2, "hessians": 1, "both": 1, "outputs": 1}


def test_hessian_traits_count_the_ties_within_each_group_check_the_mean_and_the_symmetry():
    h = torch.diag(torch.tensor([3.0, 1.0, 3.0, 2.0, 5.0, 5.0, 5.0, 4.0, 7.0]))
    traits = digests.hessian_traits(h, 4)
    assert int(traits["diag_ties"]) == 1 + 2  # {3, 3} in the first group, {5, 5, 5}; the tail left out
    assert int(digests.hessian_traits(h, 9)["diag_ties"]) == 1 + 2
    assert int(traits["mean_off"]) == 0  # 35 / 9 in fp32, both ways
    assert int(traits["asymmetric"]) == 0
    h[1, 7] = 0.5  # one entry above the diagonal whose mirror below is 0
    assert int(digests.hessian_traits(h, 4)["asymmetric"]) == 2


def test_a_diagonal_whose_fp32_mean_is_not_the_rounded_exact_mean_is_marked():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):  # PyTorch's fp32 sum parts from the exact one in some of them
        x = torch.rand(4096, generator=gen) * 3 + 1
        if float(torch.mean(x)) != float(numpy.float32(x.numpy().astype(numpy.float64).mean())):
            break
    else:
        raise AssertionError("no diagonal whose fp32 mean differs in 200")
    assert int(digests.hessian_traits(torch.diag(x), 128)["mean_off"]) == 1


def test_the_mean_is_checked_in_the_order_given():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):  # a diagonal whose fp32 mean is off in one order of its entries and not in another
        x = torch.rand(4096, generator=gen) * 3 + 1
        order = torch.randperm(4096, generator=gen)
        exact = x.double().mean().float()
        if bool(torch.mean(x) != exact) != bool(torch.mean(x[order]) != exact):
            break
    else:
        raise AssertionError("no diagonal whose mean_off depends on the order in 200")
    h = torch.diag(x)
    assert int(digests.hessian_traits(h, 128, order)["mean_off"]) == int(torch.mean(x[order]) != exact)
    assert int(digests.hessian_traits(h, 128)["mean_off"]) == int(torch.mean(x) != exact)


def test_the_largest_trait_of_any_run_is_reported_with_the_layer():
    first, second = run(2.0, "a", ["x0"], "d1"), run(2.0, "a", ["x0"], "d1")
    first["hessian_traits"] = {"o_proj": {"diag_ties": 0, "mean_off": 1}}
    second["hessian_traits"] = {"o_proj": {"diag_ties": 2, "mean_off": 0}}
    report = compare_runs.compare([first, second])
    assert report["o_proj"]["traits"] == {"diag_ties": 2, "mean_off": 1} and "traits" not in report["q_proj"]


def test_runs_of_different_batch_counts_part_where_the_shorter_ends():
    assert compare_runs.first_difference([["a", "b"], ["a", "b", "c"]]) == 2
    assert compare_runs.first_difference([["a", "b"], ["a", "b"]]) is None


def test_a_modules_calls_part_where_a_weight_changed_between_runs(monkeypatch):
    """record_calls digests each call's arguments and the module's parameters then; two runs
    whose second call saw another weight part there, in the weight alone."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])

        def forward(self, x, scale=None):
            return self.layers[1](self.layers[0](x * scale[0]))

    runs, linear_forward = [], torch.nn.Linear.forward
    for changed in (False, True, False):
        monkeypatch.setattr(torch.nn.Linear, "forward", linear_forward)  # record_calls wraps the class; undone after
        torch.manual_seed(0)
        model, calls = Model(), {}
        digests.record_calls(model, r"layers\.0$", calls)
        for step in range(3):
            if changed and step == 1:
                with torch.no_grad():
                    model.layers[0].weight[0, 0] += 1
            model(torch.ones(2, 4), scale=(torch.full((1,), 2.0),))
        runs.append({"call_digests": digests.call_digests(calls)})
    assert [len(c) for c in runs[0]["call_digests"]["layers.0"]] == [3, 3, 3]  # arg0, weight, bias
    assert compare_runs.compare_calls(runs) == {"layers.0": {"first_call": 1, "parted": ["weight"]}}
    assert compare_runs.compare_calls([runs[0], runs[2]]) == {"layers.0": {"first_call": None, "parted": []}}


def test_the_runs_whose_cache_changed_are_named_with_what_changed():
    whole = dict(run(2.0, "a", ["x0"], "d1"),
                 cache_check={"placed": 3, "placed_differing": [], "grouped": 2, "grouped_differing": []})
    changed = dict(run(2.5, "b", ["y0"], "d2"),
                   cache_check={"placed": 3, "placed_differing": ["layer_input_kwargs[0]"], "grouped": 2,
                                "grouped_differing": ["layer_inputs[0]"]})
    unchecked = run(2.0, "a", ["x0"], "d1")
    assert compare_runs.cache_changes(["w.json", "c.json", "u.json"], [whole, changed, unchecked]) == {
        "c.json": ["layer_input_kwargs[0]", "layer_inputs[0]"]}
