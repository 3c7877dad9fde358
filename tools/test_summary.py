"""Counts test cases over Bazel's JUnit files: one closing 'N passed, N failed, N skipped' line.

A test target that ran but wrote no cases (or failed to build) counts as one failure."""
import os
import sys
import xml.etree.ElementTree as ET


def main(root):
    passed = failed = skipped = 0
    for folder, _, files in os.walk(root, followlinks=True):
        if "test.xml" not in files:
            continue
        cases = ET.parse(os.path.join(folder, "test.xml")).getroot().iter("testcase")
        counted = 0
        for case in cases:
            counted += 1
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None or case.get("result") == "skipped":
                skipped += 1
            else:
                passed += 1
        if counted == 0:
            failed += 1
            print("no test cases in %s" % folder)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
