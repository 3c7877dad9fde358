#!/bin/bash
# Installs what qlink builds and tests with, from Debian 12's apt repositories only.
# Quick no-op when everything is already there.
set -euo pipefail
packages=(bazel-bootstrap libboost1.81-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libdlpack-dev
          python3-torch python3-pytest python3-numpy
          python3-pip python3-setuptools python3-wheel python3-venv   # the wheel (tools/wheel.sh) and its test
          libtorch-dev               # ATen's headers: the GPTQ reference tests and the LibTorch host
          libopenblas0-pthread       # OpenBLAS: the CPU backend's GPTQ engine loads it at run time
          liblapack3 libblas3        # the reference BLAS/LAPACK: the engine's fallback, tested beside OpenBLAS
          python3-dev                # CPython's headers: the torch bridge (python/bridge)
          clang libclang-rt-14-dev   # clang and its libFuzzer runtime: the fuzz targets
          clang-format-14 python3-flake8 git  # formatter and linter over the tracked files (tools/style.sh)
          libamdhip64-dev hipcc)     # the HIP backend: runtime headers, and hipcc for its kernels
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}"
fi
