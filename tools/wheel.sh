#!/bin/bash
# Builds the qlink wheel (qlink-<version>-cp310-abi3-linux_x86_64.whl) into DEST (default
# dist/wheel): the optimized plugin, backends, torch bridge and native CLI from Bazel, the
# Python package, metadata by setuptools through pip (Debian's python3-pip, -setuptools,
# -wheel; no download, no build isolation).
#   bash tools/wheel.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-dist/wheel}
bazel build -c opt //:plugin //:qlink
rm -rf build python/qlink.egg-info
mkdir -p "$dest"
QLINK_NATIVE_DIR="$PWD/bazel-bin" /usr/bin/python3 -m pip wheel --no-deps --no-build-isolation --no-index -q -w "$dest" .
rm -rf build python/qlink.egg-info
ls -la "$dest"/qlink-*.whl
