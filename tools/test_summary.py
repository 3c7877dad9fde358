"""Counts test cases over Bazel's JUnit files: one closing 'N passed, N failed, N skipped' line.

Takes every run's testlogs folder (one per build config: bazel-testlogs points at the
last one only). A test target that ran but wrote no cases counts as one failure, and so
does each run given in --broken-runs (it failed to build, so wrote nothing to count)."""
import argparse
import os
import sys
import xml.etree.ElementTree as ET


def count(root, totals):
    for folder, _, files in os.walk(root, followlinks=True):
        if "test.xml" not in files:
            continue
        cases = ET.parse(os.path.join(folder, "test.xml")).getroot().iter("testcase")
        counted = 0
        for case in cases:
            counted += 1
            if case.find("failure") is not None or case.find("error") is not None:
                totals["failed"] += 1
            elif case.find("skipped") is not None or case.get("result") == "skipped":
                totals["skipped"] += 1
            else:
                totals["passed"] += 1
        if counted == 0:
            totals["failed"] += 1
            print("no test cases in %s" % folder)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--broken-runs", type=int, default=0)
    parser.add_argument("testlogs", nargs="+")
    args = parser.parse_args()
    totals = {"passed": 0, "failed": args.broken_runs, "skipped": 0}
    for root in sorted(set(args.testlogs)):  # a run that built nothing leaves the previous link
        count(root, totals)
    print("%(passed)d passed, %(failed)d failed, %(skipped)d skipped" % totals)
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
