"""bench/hosts/compare_runs.py, which says where repeated runs part: the first differing
batch input of a digested layer, and per layer how many distinct losses, weights and
Hessians the runs gave."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
import compare_runs  # noqa: E402 (bench/hosts)


def run(o_proj_loss, o_proj_hessian, o_proj_batches, digest):
    return {"digest": digest, "losses": {"q_proj": 1.0, "o_proj": o_proj_loss},
            "input_digests": {"q_proj": {"weight": "w", "hessian": "h"},
                              "o_proj": {"weight": "w", "hessian": o_proj_hessian}},
            "batch_digests": {"o_proj": o_proj_batches}}


def test_a_run_whose_forward_parted_is_named_at_its_first_differing_batch():
    same = run(2.0, "a", ["x0", "x1", "x2"], "d1")
    parted = run(2.5, "b", ["x0", "y1", "y2"], "d2")
    report = compare_runs.compare([same, same, parted])
    assert report["q_proj"] == {"losses": 1, "weights": 1, "hessians": 1}  # no batch digests asked
    assert report["o_proj"] == {"losses": 2, "weights": 1, "hessians": 2, "first_batch": 1}


def test_equal_inputs_with_a_differing_hessian_point_at_the_accumulation():
    report = compare_runs.compare([run(2.0, "a", ["x0"], "d1"), run(2.1, "b", ["x0"], "d2")])
    assert report["o_proj"]["first_batch"] is None and report["o_proj"]["hessians"] == 2


def test_runs_of_different_batch_counts_part_where_the_shorter_ends():
    assert compare_runs.first_difference([["a", "b"], ["a", "b", "c"]]) == 2
    assert compare_runs.first_difference([["a", "b"], ["a", "b"]]) is None
