#!/bin/bash
# The main job on this machine: builds qlink, then `qlink probe` and `qlink demo` on the
# embedded default config (backend auto: a GPU backend with devices, else the CPU
# backend's 4 virtual devices).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bazel build -c opt //:qlink
bazel-bin/qlink probe "$@"
bazel-bin/qlink demo "$@"
