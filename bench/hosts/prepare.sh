#!/bin/bash
# Lays out what the accelerator machine needs for the host runs in DEST (a folder git
# ignores, carried to the machine): qlink's Python package with the optimized plugin, its
# backends and torch bridge in qlink/lib, GPTQModel's and AutoRound's package trees (and
# auto_round_extension, AutoRound's companion package in its repository) from
# their fetched repositories (never committed), the stand-ins, these scripts, and the
# Python tests (their GPU half checks the package's GPU paths there).
#   bash bench/hosts/prepare.sh DEST [GPTQMODEL_GIT_DIR] [AUTOROUND_GIT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=$1
gptqmodel=${2:-/work/.mirror/ModelCloud+GPTQModel/repo}
autoround=${3:-/work/.mirror/intel+auto-round/repo}
bazel build -c opt //:plugin //:libqlink_backend_fault.so //tests/python:libfake_torch_shim.so //tests/python:libfake_cusolver.so
rm -rf "$dest/python" "$dest/hosts" "$dest/bench" "$dest/tests"
mkdir -p "$dest/python/qlink/lib" "$dest/hosts" "$dest/bench" "$dest/tests"
cp -r python/qlink "$dest/python/"
cp -f bazel-bin/libqlink*.so bazel-bin/tests/python/libfake_torch_shim.so bazel-bin/tests/python/libfake_cusolver.so "$dest/python/qlink/lib/"
cp -r tests/python "$dest/tests/"
git -C "$gptqmodel" archive HEAD gptqmodel | tar -x -C "$dest/hosts"
git -C "$autoround" archive HEAD auto_round auto_round_extension | tar -x -C "$dest/hosts"
cp -r bench/hosts "$dest/bench/"
cp bench/hessian_precision.py bench/timing.py bench/gptq_bench.py bench/moe_solve_bench.py bench/attention_mask_cost.py \
  bench/attention_split.py bench/attention_determinism.py bench/block_gemms.py \
  "$dest/bench/"
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
chmod -R u+w "$dest"
du -sh "$dest"
