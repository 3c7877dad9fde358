"""Issue 43, item 7: GPTQModel alone and with qlink installed strict (every qlink path or
FallbackRefused: OPT's grouped fc1 input was refused) over a small random-weight model of
each architecture (common.make_arch: OPT, LLaMA with grouped-query attention, Qwen2, Qwen3,
Mistral, Gemma2, Mixtral through defuser), each run in its own process by gptqmodel_run.py;
prints each layer's loss alone and with qlink, then a table per architecture: the strict
run's refusal (its FallbackRefused) or what it left to GPTQModel (host counts by reason,
fallbacks), whether the batches were grouped, the largest relative loss difference of a
linear and of a layer (the sum of its linears' losses; the issue's bar, within 0.5 %, is
judged on the layer: a linear's loss moves with the rows it is given, which the layers before
and, in an MoE block, the router reassign), whether the solves' digests agree, the wall times.

    python3 bench/hosts/arch_table.py --dir MODELS [--archs opt,mixtral] [--layers 2]
        [--samples 128] [--seqlen 2048] [--references] [--out TABLE.json]
    python3 bench/hosts/arch_table.py --runs-from TABLE.json   (the table of saved runs)

--references: two more GPTQModel-alone runs per architecture, its samples in reverse order
(the same sums in another order: how far alone is from itself) and its X^T X products in
float64 (near the exact Hessian: which of alone and qlink is nearer it), and qlink solving as
GPTQModel does: hessian_precision ieee_fp32, its inverse, IEEE fp32 updates (the qlink run is
install(strict=True)'s defaults: tensor_gemm, the triangular inverse and TF32 updates).

MODELS: where each architecture's model is made (MODELS/<arch>, kept for the next run) and
each run's JSON written (MODELS/<arch>.<alone|qlink>.json)."""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import ARCHS, HOST_SOLVE  # noqa: E402 (beside this script)

BAR = 0.005  # the issue's: per-layer losses within 0.5 %


MODES = {"alone": [], "qlink": ["--qlink", "--strict", "--defaults"], "alone_reversed": ["--reversed"],
         "alone_f64": ["--hessian-f64"],
         "qlink_ieee_fp32": ["--qlink", "--strict", "--precision", "ieee_fp32"] + HOST_SOLVE}
REFERENCES = ("alone_reversed", "alone_f64", "qlink_ieee_fp32")


def run(arch, args, mode):
    """One gptqmodel_run.py process in one of MODES: its JSON result, or {"error": its last lines}."""
    out = os.path.join(args.dir, "%s.%s.json" % (arch, mode))
    cmd = [sys.executable, os.path.join(HERE, "gptqmodel_run.py"), "--model", os.path.join(args.dir, arch),
           "--model-kind", arch, "--layers", str(args.layers), "--samples", str(args.samples),
           "--seqlen", str(args.seqlen), "--out", out] + MODES[mode]
    if os.path.exists(out):
        os.remove(out)
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = round(time.perf_counter() - start, 1)
    if done.returncode != 0 or not os.path.exists(out):
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        refused = [line for line in lines if "FallbackRefused" in line]
        return {"error": (refused or lines or ["exit status %d" % done.returncode])[-1][-400:], "process_s": wall}
    with open(out) as f:
        result = json.load(f)
    result["process_s"] = wall
    return result


# The patches whose host counts say the calibration's Hessians, solves or packs were
# GPTQModel's (the others' host counts are by design: moves of CPU tensors, settings).
WORK = ("group_batches", "add_batch", "materialize_global_hessian", "quantize", "routed_experts", "pack")


def left_to_host(result):
    """What a run left to GPTQModel: {patch: "host n, fallback n: reasons"} for every patch
    with a fallback (none under strict: it raises) and WORK's with host counts."""
    said = {}
    for patch, c in sorted(result.get("counters", {}).items()):
        if c.get("fallback") or (c.get("host") and patch in WORK):
            said[patch] = "host %d, fallback %d: %s" % (c["host"], c["fallback"], "; ".join(sorted(c["reasons"])))
    return said


def outcome(result):
    """"ok", "refused" (FallbackRefused) or "failed" (another error)."""
    error = result.get("error")
    return "ok" if not error else "refused" if "FallbackRefused" in error else "failed"


def compare(alone, mine):
    """(per-layer rows, max relative difference of the losses) of two runs' results."""
    rows, worst = [], 0.0
    for name in sorted(set(alone.get("losses", {})) | set(mine.get("losses", {}))):
        a, b = alone.get("losses", {}).get(name), mine.get("losses", {}).get(name)
        rel = abs(a - b) / abs(a) if a is not None and b is not None and a else (0.0 if a == b else float("inf"))
        worst = max(worst, rel)
        rows.append((name, a, b, rel))
    return rows, worst


def layer_sums(result):
    """{decoder layer: the sum of its linears' losses} of a run's result."""
    sums = {}
    for name, loss in result.get("losses", {}).items():
        layer = re.match(r".*?\.layers\.\d+", name)
        key = layer.group(0) if layer else name
        sums[key] = sums.get(key, 0.0) + loss
    return sums


def compare_layers(alone, mine):
    """The max relative difference of two runs' per-layer loss sums (layer_sums)."""
    a, b = layer_sums(alone), layer_sums(mine)
    if set(a) != set(b) or not a:
        return float("inf")
    return max(abs(a[k] - b[k]) / abs(a[k]) if a[k] else (0.0 if a[k] == b[k] else float("inf")) for k in a)


def entry(runs):
    """An architecture's row of the table from its runs (alone, qlink, any of REFERENCES)."""
    alone, mine = runs["alone"], runs["qlink"]
    rows, worst = compare(alone, mine)
    layer_worst = compare_layers(alone, mine)
    grouped = mine.get("counters", {}).get("group_batches", {})
    row = {"alone_error": alone.get("error"), "qlink_error": mine.get("error"), "left_to_host": left_to_host(mine),
           "grouped": bool(grouped.get("qlink")) or "; ".join(grouped.get("reasons", {})) or None,
           "layers": rows, "max_rel_loss_diff": worst if rows else None,
           "max_rel_layer_diff": layer_worst if rows else None,
           "within_bar": bool(rows) and layer_worst <= BAR and "error" not in mine,
           "digests_equal": "digest" in alone and alone.get("digest") == mine.get("digest"),
           "alone_s": alone.get("quantize_s"), "qlink_s": mine.get("quantize_s"),
           "alone_process_s": alone.get("process_s"), "qlink_process_s": mine.get("process_s"), "runs": runs}
    if all(mode in runs for mode in REFERENCES):
        pairs = {"alone_reversed vs alone": ("alone", "alone_reversed"), "alone vs alone_f64": ("alone_f64", "alone"),
                 "qlink vs alone_f64": ("alone_f64", "qlink"), "qlink_ieee_fp32 vs alone": ("alone", "qlink_ieee_fp32"),
                 "qlink_ieee_fp32 vs alone_f64": ("alone_f64", "qlink_ieee_fp32")}
        row["max_rel"] = {what: (compare(runs[x], runs[y])[1], compare_layers(runs[x], runs[y]))
                          for what, (x, y) in pairs.items()}
    return row


def show(table):
    """Prints each architecture's per-linear losses, then the table."""
    for arch, t in table.items():
        print("== %s" % arch, flush=True)
        for name, x, y, rel in t["layers"]:
            shown = ["-" if v is None else "%.6g" % v for v in (x, y)]
            print("  %-48s %12s %12s %9.4f %%" % (name, shown[0], shown[1], 100 * rel))
    head = ("arch", "qlink", "grouped", "linear", "layer", "<0.5%", "digests", "alone s", "qlink s",
            "left to GPTQModel")
    print("\n%-10s %-9s %-7s %9s %9s %-6s %-7s %9s %9s  %s" % head)
    percent = (lambda x: "-" if x is None else "%.4f%%" % (100 * x))
    for arch, t in table.items():
        print("%-10s %-9s %-7s %9s %9s %-6s %-7s %9s %9s  %s" % (
            arch, outcome(t["runs"]["qlink"]), "yes" if t["grouped"] is True else "no",
            percent(t["max_rel_loss_diff"]), percent(t["max_rel_layer_diff"]),
            "yes" if t["within_bar"] else "NO", "equal" if t["digests_equal"] else "differ",
            t["alone_s"], t["qlink_s"], "; ".join("%s: %s" % kv for kv in t["left_to_host"].items()) or "-"))
        for what in ("alone_error", "qlink_error"):
            if t[what]:
                print("    %s: %s" % (what, t[what]))
        if t["grouped"] not in (True, None):
            print("    not grouped: %s" % t["grouped"])
        for what, (linear, layer) in t.get("max_rel", {}).items():
            print("    %s: max rel %.4f%% a linear, %.4f%% a layer" % (what, 100 * linear, 100 * layer))


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--dir", help="models and the runs' JSON (MODELS/<arch>, MODELS/<arch>.*.json)")
    a.add_argument("--archs", default=",".join(ARCHS), help="comma-separated, of %s" % ", ".join(ARCHS))
    a.add_argument("--layers", type=int, default=2)
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seqlen", type=int, default=2048)
    a.add_argument("--references", action="store_true", help="alone reversed and alone in float64 too")
    a.add_argument("--runs-from", metavar="TABLE.json", help="no runs: the table of an earlier --out's runs")
    a.add_argument("--out", help="the table and every run's result as JSON")
    args = a.parse_args()
    if args.runs_from:
        with open(args.runs_from) as f:
            table = {arch: entry(t["runs"]) for arch, t in json.load(f).items()}
    else:
        if not args.dir:
            a.error("--dir is needed to run (or --runs-from)")
        archs = [x for x in args.archs.split(",") if x]
        unknown = sorted(set(archs) - set(ARCHS))
        if unknown:
            a.error("unknown architectures: %s" % ", ".join(unknown))
        os.makedirs(args.dir, exist_ok=True)
        table = {}
        for arch in archs:
            runs = {"alone": run(arch, args, "alone")}  # first: it makes the model
            runs["qlink"] = run(arch, args, "qlink")
            runs.update((mode, run(arch, args, mode)) for mode in REFERENCES if args.references)
            table[arch] = entry(runs)
    show(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
