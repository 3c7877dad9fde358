"""Two GPTQModel runs of gptqmodel_run.py (--out A.json --codes A.pt, the same for B) layer
by layer: the share of 4-bit levels that are equal and the two layer losses. Writes
OUT.json and prints the markdown table.

    python3 compare_codes.py A.json A.pt B.json B.pt OUT.json
"""
import json
import sys

import torch


def main():
    a_json, a_codes, b_json, b_codes, out = sys.argv[1:6]
    runs = [json.load(open(a_json)), json.load(open(b_json))]
    codes = [torch.load(a_codes), torch.load(b_codes)]
    rows = []
    for layer in sorted(codes[0]):
        if layer not in codes[1]:
            continue
        equal = (codes[0][layer] == codes[1][layer]).double().mean().item()
        la, lb = runs[0]["losses"].get(layer), runs[1]["losses"].get(layer)
        diff = abs(lb / la - 1) if isinstance(la, float) and isinstance(lb, float) and la else float("nan")
        rows.append({"layer": layer, "codes_equal": equal, "loss_a": la, "loss_b": lb, "loss_rel_diff": diff})
    lines = ["| layer | codes equal | loss A | loss B | loss difference |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %.3f %% | %.6g | %.6g | %.3f %% |" %
                     (r["layer"], 100 * r["codes_equal"], r["loss_a"], r["loss_b"], 100 * r["loss_rel_diff"]))
    if rows:
        lines.append("")
        lines.append("worst: codes equal %.3f %%, loss difference %.3f %%" % (
            100 * min(r["codes_equal"] for r in rows), 100 * max(r["loss_rel_diff"] for r in rows)))
    print("A = %s, B = %s\n" % (a_json, b_json) + "\n".join(lines))
    with open(out, "w") as f:
        json.dump({"a": a_json, "b": b_json, "layers": rows}, f, indent=1)


if __name__ == "__main__":
    main()
