"""The host runs' JSON files (tools/device.sh) as the tables of bench/RESULTS.md.

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
            lines.append("speedup over GPTQModel alone: %.2fx" %
                         (host["quantize_s"] / min(r["quantize_s"] for r in runs)))
            worst = max(((abs(runs[0]["losses"][k] / v - 1), k) for k, v in host["losses"].items()
                         if isinstance(v, float) and v and isinstance(runs[0]["losses"].get(k), float)),
                        default=(float("nan"), "no layer losses to compare"))
            lines.append("largest layer-loss difference to GPTQModel alone: %.3f %% (%s)" % (100 * worst[0], worst[1]))
        lines.append("counters: %s" % json.dumps(runs[0].get("counters"), sort_keys=True))
    return lines


def slope(points):
    """Least-squares seconds per added layer over (layers, seconds) points."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def loop(out):
    """Issue 23: GPTQModel's loop at 2/4/8 layers alone and with qlink (tools/device.sh OUT loop)."""
    runs = {os.path.basename(p)[len("loop_"):-len(".json")]: load(p)
            for p in sorted(glob.glob(os.path.join(out, "loop_*.json")))}
    runs = {k: v for k, v in runs.items() if v}
    if not runs:
        return ["GPTQModel loop: no run finished"]
    lines = ["| GPTQModel loop, 4-bit g128 | layers | wall (s) | peak GPU, torch (GiB) | GPU busy (kernels; "
             "kernels or copies) | accumulations, shared |", "|---|---|---|---|---|---|"]
    for name, r in sorted(runs.items(), key=lambda kv: (kv[1]["qlink"], kv[1]["layers"], kv[0])):
        busy = ("%.0f %%; %.0f %%" % (100 * r["gpu_busy_kernels"], 100 * r["gpu_busy_kernels_or_copies"])
                if "gpu_busy_kernels" in r else "")
        h = r.get("hessian_counters") or {}
        lines.append("| %s | %d | %.1f | %.2f | %s | %s |" % (
            name, r["layers"], r["quantize_s"], r["peak_torch_gib"], busy,
            "%s, %s" % (h["accumulations"], h["shared"]) if h else ""))
    lines.append("")
    for label, with_qlink, precision in (("alone", False, None), ("with qlink, ieee_fp32", True, "ieee_fp32"),
                                         ("with qlink, tensor", True, "tensor")):
        points = sorted((r["layers"], r["quantize_s"]) for r in runs.values()
                        if r["qlink"] == with_qlink and not r.get("profiled") and r.get("precision") == precision)
        if points:
            lines.append("%s: %s; per added layer %.2f s" % (
                label, ", ".join("%d layers %.1f s" % p for p in points), slope(points)))
    twos = [r for k, r in runs.items() if r["qlink"] and r["layers"] == 2 and r.get("precision") == "ieee_fp32"]
    if twos:
        lines.append("qlink 2-layer ieee_fp32 runs: %d, bit-identical: %s" %
                     (len(twos), len({r["digest"] for r in twos}) == 1))
    host2, qlink2 = runs.get("host2"), runs.get("qlink2")
    for name in ("qlink2", "qlink2_tensor"):
        if host2 and runs.get(name):
            lines.append("2 layers, %s: %.2fx GPTQModel alone" % (name, host2["quantize_s"] / runs[name]["quantize_s"]))
    for name in ("codes_ieee_vs_host", "codes_tensor_vs_ieee"):
        c = load(os.path.join(out, name + ".json"))
        if c and c["layers"]:
            lines.append("%s: worst codes equal %.3f %%, worst loss difference %.3f %%, first layer's codes equal "
                         "%.3f %%" % (name, 100 * min(r["codes_equal"] for r in c["layers"]),
                                      100 * max(r["loss_rel_diff"] for r in c["layers"]),
                                      100 * min((r["codes_equal"] for r in c["layers"]
                                                 if r["layer"].startswith("model.layers.0.")), default=float("nan"))))
    counters = (qlink2 or {}).get("counters", {}).get("add_batch")
    if counters:
        lines.append("add_batch counters: %s" % json.dumps(counters, sort_keys=True))
    return lines


def runs(out):
    """Every other GPTQModel run (speed, defaults, the MoE stage...): its wall time, each
    layer's first solve, peak memory, digest; and per added
    layer, by least squares over runs of one name but their layer count (speed_qlink2,
    speed_qlink4, speed_qlink32) and one model kind."""
    found = {}
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        name = os.path.basename(path)[:-len(".json")]
        r = load(path)
        if r and r.get("host") == "GPTQModel" and not name.startswith(("loop_", "gptq_")) and "quantize_s" in r:
            found[name] = r
    if not found:
        return []
    lines = ["| GPTQModel run | kind | layers | qlink | wall (s) | first solves (s) | peak GPU, torch (GiB) | digest |",
             "|---|---|---|---|---|---|---|---|"]
    groups = {}
    for name, r in found.items():
        first = [v for _, v in sorted((int(k), v) for k, v in (r.get("first_solve_s") or {}).items())]
        lines.append("| %s | %s | %d | %s | %.2f | %s | %.2f | %s |" % (
            name, r["model_kind"], r["layers"], "yes" if r["qlink"] else "no", r["quantize_s"],
            ", ".join("%.1f" % v for v in first), r["peak_torch_gib"], (r.get("digest") or "none")[:8]))
        groups.setdefault((name.rstrip("0123456789"), r["model_kind"]), []).append((r["layers"], r["quantize_s"]))
    lines.append("")
    for (prefix, kind), points in sorted(groups.items()):
        if len({layers for layers, _ in points}) > 1:
            lines.append("%s (%s): %s; per added layer %.3f s" % (
                prefix, kind, ", ".join("%d layers %.2f s" % p for p in sorted(points)), slope(points)))
    return lines


def autoround(out, prefix, label):
    """AutoRound alone and with qlink: each timed after a warm-up run of itself in its process
    (autoround_run.py; alone's rows of process settings each a timed run after the same
    warm-up), the tuning time of AutoRound's own log line, the GPU's busy share of the profiled
    run, each block's final loss and the output error on held-out sequences."""
    host, ql = load(os.path.join(out, prefix + "_host.json")), load(os.path.join(out, prefix + "_qlink.json"))
    if not host and not ql:
        return ["AutoRound %s: no run finished" % label]
    lines = ["| AutoRound W4A16 %s | tuning (s; warm-up) | wall (s) | GPU busy (kernels; or copies) | final block "
             "losses | output MSE, 16 held-out |" % label, "|---|---|---|---|---|---|"]
    rows = [("alone, %s" % ("+".join(row["settings"]) or "no setting"), dict(row, warmup_tuning_s=""))
            for row in (host or {}).get("rows", [])] or [("alone", host)]
    for name, r in rows + [("qlink installed", ql)]:
        if r:
            busy = ("%.0f %%; %.0f %%" % (100 * r["gpu_busy_kernels"], 100 * r["gpu_busy_kernels_or_copies"])
                    if "gpu_busy_kernels" in r else "")
            lines.append("| %s | %s; %s | %.1f | %s | %s | %.4g |" % (
                name, r.get("tuning_s"), r.get("warmup_tuning_s"), r["quantize_s"], busy,
                ", ".join("%.6f" % x for x in r["final_losses"]), r["output_mse"]))
    if host and ql:
        lines.append("")
        if host.get("tuning_s") and ql.get("tuning_s"):
            lines.append("tuning speed-up with qlink: %.2fx" % (host["tuning_s"] / ql["tuning_s"]))
        pairs = list(zip(host["final_losses"], ql["final_losses"]))
        if pairs:
            lines.append("final losses, qlink / alone - 1: %s" % ", ".join("%+.2f %%" % (100 * (q / h - 1))
                                                                           for h, q in pairs if h))
        if host["output_mse"]:
            lines.append("output MSE, qlink / alone - 1: %+.2f %%" %
                         (100 * (ql["output_mse"] / host["output_mse"] - 1)))
    if ql:
        lines.append("")
        lines += ["plan %s: %s" % (name, text.replace("\n", "; ")) for name, text in ql.get("plans", [])[:1]]
        lines.append("counters: %s" % json.dumps(ql.get("counters"), sort_keys=True))
    return lines


def main():
    out = sys.argv[1]
    for block in (gptq(out), loop(out), runs(out), autoround(out, "ar", "iters=200"),
                  autoround(out, "ar0", "iters=0"), autoround(out, "bd_ar", "breakdown")):
        if block:
            print("\n".join(block) + "\n")


if __name__ == "__main__":
    main()
