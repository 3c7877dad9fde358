#!/bin/bash
# The whole test suite: installs what it needs, runs `bazel test //...`, and closes with
# one "N passed, N failed, N skipped" line counted over every test case.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh || exit 1
bazel test //... "$@"
rc=$?
/usr/bin/python3 tools/test_summary.py bazel-testlogs || rc=1
exit $rc
