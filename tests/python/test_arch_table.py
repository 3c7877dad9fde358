"""bench/hosts/arch_table.py's judgement of a run against GPTQModel alone: per linear, and per
decoder layer (the sum of its linears' losses), the issue's 0.5 % bar judged on the layer: a
router that gives an expert's rows to another moves both experts' losses, not the layer's."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
import arch_table  # noqa: E402 (bench/hosts)


def run(losses, digest="d"):
    return {"losses": losses, "digest": digest, "quantize_s": 1.0, "process_s": 2.0,
            "counters": {"group_batches": {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}}}


ALONE = {"model.layers.0.mlp.experts.0.up_proj": 1.0, "model.layers.0.mlp.experts.1.up_proj": 3.0,
         "model.layers.0.self_attn.o_proj": 0.5, "model.layers.1.self_attn.o_proj": 2.0}


def test_rows_moved_between_experts_change_the_linears_not_the_layer():
    moved = dict(ALONE, **{"model.layers.0.mlp.experts.0.up_proj": 1.1, "model.layers.0.mlp.experts.1.up_proj": 2.9})
    row = arch_table.entry({"alone": run(ALONE), "qlink": run(moved, "e")})
    assert abs(row["max_rel_loss_diff"] - 0.1) < 1e-12  # expert 0's 10 %
    assert row["max_rel_layer_diff"] == 0.0 and row["within_bar"]
    assert not row["digests_equal"]


def test_a_layer_whose_sum_moves_past_the_bar_fails_it_and_a_refusal_fails_it():
    worse = dict(ALONE, **{"model.layers.1.self_attn.o_proj": 2.0 * 1.006})
    row = arch_table.entry({"alone": run(ALONE), "qlink": run(worse)})
    assert abs(row["max_rel_layer_diff"] - 0.006) < 1e-12 and not row["within_bar"]
    assert arch_table.layer_sums(run(ALONE)) == {"model.layers.0": 4.5, "model.layers.1": 2.0}
    refused = arch_table.entry({"alone": run(ALONE), "qlink": {"error": "FallbackRefused: x", "process_s": 1.0}})
    assert not refused["within_bar"] and arch_table.outcome(refused["runs"]["qlink"]) == "refused"


def test_the_references_are_compared_per_linear_and_per_layer():
    runs = {"alone": run(ALONE), "qlink": run(ALONE)}
    runs.update((mode, run(ALONE)) for mode in arch_table.REFERENCES)
    row = arch_table.entry(runs)
    assert set(row["max_rel"]) == {"alone_reversed vs alone", "alone vs alone_f64", "qlink vs alone_f64",
                                   "qlink_ieee_fp32 vs alone", "qlink_ieee_fp32 vs alone_f64"}
    assert all(pair == (0.0, 0.0) for pair in row["max_rel"].values())
