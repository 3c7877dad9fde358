"""Issue 43, item 7: GPTQModel alone and with qlink installed strict (every qlink path or
FallbackRefused: OPT's grouped fc1 input was refused) over a small random-weight model of
each architecture (common.make_arch: OPT, LLaMA with grouped-query attention, Qwen2, Qwen3,
Mistral, Gemma2, Mixtral through defuser), each run in its own process by gptqmodel_run.py;
prints each layer's loss alone and with qlink, then a table per architecture: the strict
run's refusal (its FallbackRefused) or what it left to GPTQModel (host counts by reason,
fallbacks), whether the batches were grouped, the largest relative loss difference (the
issue's bar: within 0.5 %), whether the solves' digests agree, the wall times.

    python3 bench/hosts/arch_table.py --dir MODELS [--archs opt,mixtral] [--layers 2]
        [--samples 128] [--seqlen 2048] [--references] [--out TABLE.json]

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


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--dir", required=True, help="models and the runs' JSON (MODELS/<arch>, MODELS/<arch>.*.json)")
    a.add_argument("--archs", default=",".join(ARCHS), help="comma-separated, of %s" % ", ".join(ARCHS))
    a.add_argument("--layers", type=int, default=2)
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seqlen", type=int, default=2048)
    a.add_argument("--references", action="store_true", help="alone reversed and alone in float64 too")
    a.add_argument("--out", help="the table and every run's result as JSON")
    args = a.parse_args()
    archs = [x for x in args.archs.split(",") if x]
    unknown = sorted(set(archs) - set(ARCHS))
    if unknown:
        a.error("unknown architectures: %s" % ", ".join(unknown))
    os.makedirs(args.dir, exist_ok=True)
    table = {}
    for arch in archs:
        alone = run(arch, args, "alone")  # first: it makes the model
        mine = run(arch, args, "qlink")
        rows, worst = compare(alone, mine)
        references = {mode: run(arch, args, mode) for mode in REFERENCES if args.references}
        grouped = mine.get("counters", {}).get("group_batches", {})
        table[arch] = {
            "alone_error": alone.get("error"), "qlink_error": mine.get("error"), "left_to_host": left_to_host(mine),
            "grouped": bool(grouped.get("qlink")) or "; ".join(grouped.get("reasons", {})) or None,
            "layers": rows, "max_rel_loss_diff": worst if rows else None,
            "within_bar": bool(rows) and worst <= BAR and "error" not in mine,
            "digests_equal": "digest" in alone and alone.get("digest") == mine.get("digest"),
            "alone_s": alone.get("quantize_s"), "qlink_s": mine.get("quantize_s"),
            "alone_process_s": alone["process_s"], "qlink_process_s": mine["process_s"],
            "runs": dict(references, alone=alone, qlink=mine)}
        if references:
            exact = references["alone_f64"]
            table[arch]["max_rel"] = {"alone_reversed vs alone": compare(alone, references["alone_reversed"])[1],
                                      "alone vs alone_f64": compare(exact, alone)[1],
                                      "qlink vs alone_f64": compare(exact, mine)[1],
                                      "qlink_ieee_fp32 vs alone": compare(alone, references["qlink_ieee_fp32"])[1],
                                      "qlink_ieee_fp32 vs alone_f64": compare(exact, references["qlink_ieee_fp32"])[1]}
        print("== %s" % arch, flush=True)
        for name, x, y, rel in rows:
            shown = ["-" if v is None else "%.6g" % v for v in (x, y)]
            print("  %-48s %12s %12s %9.4f %%" % (name, shown[0], shown[1], 100 * rel))
    head = ("arch", "qlink", "grouped", "max rel", "<0.5%", "digests", "alone s", "qlink s", "left to GPTQModel")
    print("\n%-10s %-9s %-7s %9s %-6s %-7s %9s %9s  %s" % head)
    for arch, t in table.items():
        refused = outcome(t["runs"]["qlink"])
        print("%-10s %-9s %-7s %9s %-6s %-7s %9s %9s  %s" % (
            arch, refused, "yes" if t["grouped"] is True else "no",
            "-" if t["max_rel_loss_diff"] is None else "%.4f%%" % (100 * t["max_rel_loss_diff"]),
            "yes" if t["within_bar"] else "NO", "equal" if t["digests_equal"] else "differ",
            t["alone_s"], t["qlink_s"], "; ".join("%s: %s" % kv for kv in t["left_to_host"].items()) or "-"))
        for what in ("alone_error", "qlink_error"):
            if t[what]:
                print("    %s: %s" % (what, t[what]))
        if t["grouped"] not in (True, None):
            print("    not grouped: %s" % t["grouped"])
        for what, rel in t.get("max_rel", {}).items():
            print("    %s: max rel %.4f%%" % (what, 100 * rel))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
