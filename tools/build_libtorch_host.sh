#!/bin/bash
# Builds tools/gptq_libtorch_host.cc against the LibTorch of the python3 on PATH (PyTorch's
# wheel: headers and libraries in its package), without Bazel: what a C++ host on that
# PyTorch does. Usage: bash tools/build_libtorch_host.sh OUT [DLPACK_INCLUDE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
dlpack=${2:-/usr/include}  # qlink.h includes <dlpack/dlpack.h>
read -r torch abi < <(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__), int(torch._C._GLIBCXX_USE_CXX11_ABI))')
g++ -std=c++17 -O2 -D_GLIBCXX_USE_CXX11_ABI="$abi" -I. -I"$dlpack" -I"$torch/include" \
  -I"$torch/include/torch/csrc/api/include" tools/gptq_libtorch_host.cc -o "$out" \
  -L"$torch/lib" -Wl,--no-as-needed -ltorch_cuda -ltorch_cpu -lc10 -Wl,--as-needed -Wl,-rpath,"$torch/lib" -ldl
