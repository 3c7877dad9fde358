"""wheel_run.sh's runs side by side: GPTQModel with install() in the script and with no
qlink line under `qlink run`, from the same wheel in the same lease: wall time of the
quantization, the digest of every layer's solve, and what ran through qlink.

    python3 compare_wheel_runs.py OUTDIR
"""
import glob
import json
import os
import sys

from summarize import load


def main(out):
    runs = {"install": [], "qlink run": []}
    for kind, pattern in (("install", "install[0-9]*.json"), ("qlink run", "run[0-9].json")):
        for path in sorted(glob.glob(os.path.join(out, pattern))):
            result = load(path)
            report = load(path.replace(".json", "_report.json")) if kind == "qlink run" else None
            if result:
                runs[kind].append((os.path.basename(path), result, report))
    print("| run | quantize (s) | layers solved | digest of their solves |")
    print("|---|---|---|---|")
    for kind, items in runs.items():
        for name, r, _ in items:
            print("| %s (%s) | %.1f | %d | %s |" % (kind, name, r["quantize_s"], r["packed_tensors"], r["digest"][:16]))
    if not runs["install"] or not runs["qlink run"]:
        print("\nnot comparable: a side has no finished run")
        return 1
    digests = {r["digest"] for items in runs.values() for _, r, _ in items}
    print("\nsame layer digests in every run: %s" % (len(digests) == 1))
    best = {kind: min(r["quantize_s"] for _, r, _ in items) for kind, items in runs.items()}
    print("best quantize time: install() %.1f s, qlink run %.1f s (qlink run / install() = %.3f)" % (
        best["install"], best["qlink run"], best["qlink run"] / best["install"]))
    installed = runs["install"][0][1].get("counters")
    for name, _, report in runs["qlink run"]:
        g = (report or {}).get("integrations", {}).get("gptqmodel", {})
        print("%s: report says gptqmodel %s, strict %s, exit code %s; counters equal to install()'s: %s" % (
            name, g.get("state"), (report or {}).get("settings", {}).get("strict"), (report or {}).get("exit_code"),
            g.get("counters") == installed))
    print("qlink packages used: %s" % sorted({str(r.get("qlink_package")) for items in runs.values()
                                              for _, r, _ in items}))
    print("counters (install): %s" % json.dumps(installed, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
