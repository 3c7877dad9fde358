#!/bin/bash
# The whole test suite: installs what it needs, runs `bazel test //...`, the C++ tests
# again under ASan, UBSan and TSan, and the libFuzzer targets for a bounded time each;
# closes with one "N passed, N failed, N skipped" line counted over every run's test cases.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh || exit 1
rc=0
testlogs=()    # each run's testlogs folder (bazel-testlogs follows the last config only)
broken_runs=0  # runs that failed without a failing test case to count (a build error)

run() {
  bazel test "$@"
  local code=$?
  [ $code -ne 0 ] && rc=1
  [ $code -ne 0 ] && [ $code -ne 3 ] && broken_runs=$((broken_runs + 1))
  testlogs+=("$(readlink -f bazel-testlogs)")
}

run //... "$@"
# The Python test runs /usr/bin/python3, which cannot load a sanitized libqlink.so.
for sanitizer in asan ubsan tsan; do
  run --config=$sanitizer --test_tag_filters=-no_sanitizer //... "$@"
done
run --config=fuzz //tests/fuzz:config_fuzzer //tests/fuzz:abi_fuzzer "$@"

/usr/bin/python3 tools/test_summary.py --broken-runs $broken_runs "${testlogs[@]}" || rc=1
exit $rc
