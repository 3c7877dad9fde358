#!/bin/bash
# Collects the optimized build into one folder (default dist/): libqlink.so, its backends
# and the qlink CLI, side by side as they load each other. This is what travels to a
# machine without Bazel (the accelerator machine).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
bazel build -c opt //:plugin //:qlink //tests/python:libfake_torch_shim.so
mkdir -p "$out"
rm -f "$out"/*.so "$out"/qlink
# The fake torch shim is test only: the Python tests look for it beside libqlink.so.
cp -f bazel-bin/libqlink*.so bazel-bin/qlink bazel-bin/tests/python/libfake_torch_shim.so "$out"/
chmod u+w "$out"/*
ls -la "$out"
