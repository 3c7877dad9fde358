"""The host runs' JSON files (run_all.sh) as the tables of bench/RESULTS.md.

    python3 summarize.py OUTDIR
"""
import glob
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def gptq(out):
    host = load(os.path.join(out, "gptq_host.json"))
    runs = [r for r in (load(p) for p in sorted(glob.glob(os.path.join(out, "gptq_qlink*.json")))) if r]
    if not host and not runs:
        return ["GPTQModel: no run finished"]
    lines = ["| GPTQModel 4-bit g128 | wall (s) | layers solved | digest of their solves |", "|---|---|---|---|"]
    for name, r in [("alone", host)] + [("qlink, strict, run %d" % (i + 1), r) for i, r in enumerate(runs)]:
        if r:
            lines.append("| %s | %.1f | %d | %s |" % (name, r["quantize_s"], r["packed_tensors"], r["digest"][:16]))
    if runs:
        lines.append("")
        lines.append("qlink runs bit-identical: %s" % (len({r["digest"] for r in runs}) == 1))
        if host:
            lines.append("speedup over GPTQModel alone: %.2fx" % (host["quantize_s"] / min(r["quantize_s"] for r in runs)))
            worst = max(((abs(runs[0]["losses"][k] / v - 1), k) for k, v in host["losses"].items()
                         if isinstance(v, float) and v and isinstance(runs[0]["losses"].get(k), float)),
                        default=(float("nan"), "no layer losses to compare"))
            lines.append("largest layer-loss difference to GPTQModel alone: %.3f %% (%s)" % (100 * worst[0], worst[1]))
        lines.append("counters: %s" % json.dumps(runs[0].get("counters"), sort_keys=True))
    return lines


def autoround(out, prefix, label):
    host, ql = load(os.path.join(out, prefix + "_host.json")), load(os.path.join(out, prefix + "_qlink.json"))
    if not host and not ql:
        return ["AutoRound %s: no run finished" % label]
    lines = ["| AutoRound W4G128 %s | wall (s) | final block losses |" % label, "|---|---|---|"]
    for name, r in (("alone", host), ("qlink installed", ql)):
        if r:
            lines.append("| %s | %.1f | %s |" % (name, r["quantize_s"], ", ".join("%.6f" % x for x in r["final_losses"])))
    if ql:
        lines.append("")
        lines += ["plan %s: %s" % (name, text.replace("\n", "; ")) for name, text in ql.get("plans", [])[:1]]
        lines.append("counters: %s" % json.dumps(ql.get("counters"), sort_keys=True))
    return lines


def main():
    out = sys.argv[1]
    for block in (gptq(out), autoround(out, "ar", "iters=200"), autoround(out, "ar0", "iters=0")):
        print("\n".join(block) + "\n")


if __name__ == "__main__":
    main()
