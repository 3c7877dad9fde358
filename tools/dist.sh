#!/bin/bash
# Collects the optimized build into one folder (default dist/): libqlink.so, its backends,
# the torch bridge and the qlink CLI, side by side as they load each other, plus what the
# GPU tests and benchmarks need there (the C++ test and bench binaries, the fake torch
# shim). This travels with the source tree (whose bench/ holds the benchmark and baseline
# scripts) to a machine without Bazel (the accelerator machine), where tools/device_run.sh
# runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
bazel build -c opt //:plugin //:qlink //tests/python:libfake_torch_shim.so //tests/python:libfake_cusolver.so //tests:conformance_test //tests:stress_test \
  //bench:abi_overhead
mkdir -p "$out" "$out/rf/qlink"
rm -f "$out"/*.so "$out"/qlink "$out"/rf/qlink/*.so
cp -f bazel-bin/libqlink*.so bazel-bin/qlink bazel-bin/tests/python/libfake_torch_shim.so bazel-bin/tests/python/libfake_cusolver.so bazel-bin/tests/conformance_test \
  bazel-bin/tests/stress_test bazel-bin/bench/abi_overhead "$out"/
cp -f bazel-bin/libqlink*.so "$out"/rf/qlink/  # stress_test finds the plugin as its runfiles
chmod -R u+w "$out"
ls -la "$out"
