"""Where repeated runs of one gptqmodel_run.py command part (issue 40's rare divergence:
about one 4-layer run in 12 solved layer 0's o_proj differently): for each layer, in
solve order, how many distinct losses, weight digests and merged-Hessian digests the runs
gave (--input-digests), and for the layers whose add_batch inputs were digested
(--batch-digests, one digest per sample) the first sample whose input differs between runs
(its index in feeding order); for the modules whose
calls were digested (--call-digests), the first call where the runs part and what parted
there (which argument, or which parameter); and the runs whose calibration cache changed
after it was made (--cache-check). A layer whose inputs agree but whose Hessian does not
points at the accumulation; one whose batch inputs differ, at the forwards.

    python3 bench/hosts/compare_runs.py RUN.json... [--out REPORT.json]
"""
import argparse
import json


def first_difference(sequences):
    """The first index where the sequences (lists of digests) differ, or None."""
    for i, values in enumerate(zip(*sequences)):
        if len(set(values)) > 1:
            return i
    return None if len({len(s) for s in sequences}) == 1 else min(len(s) for s in sequences)


def compare(runs):
    """{layer: {"losses", "damps", "weights", "hessians", "outputs": distinct counts, "first_batch":
    index, "traits": {trait: the largest any run's Hessian gave} (gptqmodel_run.py's
    hessian_traits)}} over every layer all the runs solved, in the first run's order."""
    report = {}
    for name in runs[0]["losses"]:
        if not all(name in r["losses"] for r in runs):
            continue
        inputs = [r.get("input_digests", {}).get(name, {}) for r in runs]
        row = {"losses": len({r["losses"][name] for r in runs}),
               "damps": len({r.get("damps", {}).get(name) for r in runs}),
               "weights": len({i.get("weight") for i in inputs}),
               "hessians": len({i.get("hessian") for i in inputs}),
               "outputs": len({r.get("solve_digests", {}).get(name) for r in runs})}
        traits = [t for t in (r.get("hessian_traits", {}).get(name) for r in runs) if t]
        if traits:
            row["traits"] = {k: max(t[k] for t in traits) for k in sorted(traits[0])}
        batches = [r.get("batch_digests", {}).get(name) for r in runs]
        if all(b is not None for b in batches):
            row["first_batch"] = first_difference(batches)
        report[name] = row
    return report


def agreement(report):
    """{"solves", "weights", "hessians", "both", "outputs"}: how many of the report's solves all
    the runs gave one weight, one Hessian, both (the solves that could give equal codes), one
    output (the solve's Q, scales, zeros and g_idx: the bytes the next forwards read)."""
    rows = list(report.values())
    return {"solves": len(rows), "weights": sum(r["weights"] == 1 for r in rows),
            "hessians": sum(r["hessians"] == 1 for r in rows),
            "both": sum(r["weights"] == 1 and r["hessians"] == 1 for r in rows),
            "outputs": sum(r.get("outputs") == 1 for r in rows)}


def compare_calls(runs):
    """{module: {"first_call": index, "parted": [labels]}} for every module whose calls each
    run digested: the first call where any digest differs, and the labels that do there
    (first_call None where all agree)."""
    report = {}
    digested = [r.get("call_digests", {}) for r in runs]
    for name in digested[0]:
        calls = [d.get(name) for d in digested]
        if any(c is None for c in calls):
            continue
        row = {"first_call": None, "parted": []}
        for index, at in enumerate(zip(*calls)):
            labels = sorted(set().union(*at))
            parted = [label for label in labels if len({call.get(label) for call in at}) > 1]
            if parted:
                row = {"first_call": index, "parted": parted}
                break
        else:
            if len({len(c) for c in calls}) > 1:
                row["first_call"] = min(len(c) for c in calls)
        report[name] = row
    return report


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("runs", nargs="+")
    a.add_argument("--out")
    args = a.parse_args()
    runs = []
    for path in args.runs:
        with open(path) as f:
            runs.append(json.load(f))
    report = compare(runs)
    digests = sorted({r["digest"][:8] for r in runs})
    print("%d runs, %d distinct digests: %s" % (len(runs), len(digests), " ".join(digests)))
    agreed = agreement(report)
    print("%(solves)d solves: equal weights in %(weights)d, equal Hessians in %(hessians)d, both in %(both)d, "
          "equal outputs in %(outputs)d" % agreed)
    for name, row in report.items():
        parted = max(row["losses"], row["damps"], row["weights"], row["hessians"], row["outputs"]) > 1
        if parted or row.get("first_batch") is not None:
            traits = ", ".join("%s %d" % item for item in row.get("traits", {}).items()) or "-"
            print("  %-40s losses %d, damps %d, weights %d, Hessians %d, outputs %d, first differing sample %s, "
                  "traits %s" % (name, row["losses"], row["damps"], row["weights"], row["hessians"], row["outputs"],
                                 row.get("first_batch", "-"), traits))
    calls = compare_calls(runs)
    for name, row in calls.items():
        print("  %-40s calls part at %s: %s" % (name, row["first_call"], ", ".join(row["parted"]) or "-"))
    changed = cache_changes(args.runs, runs)
    for path, names in changed.items():
        print("  %s: its cache changed after its making: %s" % (path, ", ".join(names)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"digests": digests, "agreement": agreed, "layers": report, "calls": calls,
                       "cache_changed": changed}, f, indent=1)


def cache_changes(paths, runs):
    """{run's path: the cache tensors (cache_check.py's names) that no longer held their
    bytes at its end}, for the runs that made --cache-check and found some."""
    changed = {}
    for path, run in zip(paths, runs):
        check = run.get("cache_check") or {}
        names = check.get("placed_differing", []) + check.get("grouped_differing", [])
        if names:
            changed[path] = names
    return changed


if __name__ == "__main__":
    main()
