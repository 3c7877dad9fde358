#!/bin/bash
# The formatter and the linter over every tracked file they cover: Debian 12's clang-format 14
# (.clang-format) for C, C++ and CUDA; flake8 (.flake8) for Python.
#   bash tools/style.sh format [ROOT]  rewrite the C/C++/CUDA files in place (before committing)
#   bash tools/style.sh check [ROOT]   fail naming each file and line clang-format would change
#   bash tools/style.sh lint [ROOT]    fail naming each file and line flake8 reports
# ROOT is a git checkout, by default the one holding this script; its own .clang-format and
# .flake8 apply. //tests/style runs check and lint in CI.
set -uo pipefail
mode=${1:-}
root=${2:-$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)}
CLANG_FORMAT=clang-format-14

if ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "style.sh: $root is not a git checkout: its tracked files cannot be listed" >&2
  exit 2
fi
tracked() { git -C "$root" ls-files -z -- "$@"; }

# tests/abi_fixture/ holds the 1.0 header byte for byte as it shipped: never reformatted.
cxx_files() { tracked '*.c' '*.cc' '*.cpp' '*.cu' '*.cuh' '*.h' '*.hpp' ':!tests/abi_fixture/'; }

case "$mode" in
  format)
    cd "$root" && cxx_files | xargs -0 -r "$CLANG_FORMAT" -i
    ;;
  check)
    cd "$root" && cxx_files | xargs -0 -r "$CLANG_FORMAT" --dry-run --Werror || {
      echo "style.sh: files above are not clang-formatted; run: bash tools/style.sh format" >&2
      exit 1
    }
    ;;
  lint)
    cd "$root" && tracked '*.py' | xargs -0 -r /usr/bin/python3 -m flake8 --config "$root/.flake8"
    ;;
  *)
    echo "usage: $0 format|check|lint [ROOT]" >&2
    exit 2
    ;;
esac
