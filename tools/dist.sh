#!/bin/bash
# Collects the optimized build into one folder (default dist/): libqlink.so, its backends
# and the qlink CLI, side by side as they load each other. This is what travels to a
# machine without Bazel (the accelerator machine).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
bazel build -c opt //:plugin //:qlink
mkdir -p "$out"
rm -f "$out"/*.so "$out"/qlink
cp -f bazel-bin/libqlink*.so bazel-bin/qlink "$out"/
chmod u+w "$out"/*
ls -la "$out"
