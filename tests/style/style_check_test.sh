#!/bin/bash
# tools/style.sh's check and lint on a tiny git checkout in $TEST_TMPDIR with the project's
# .clang-format and .flake8: clean files pass; a misformatted C++ file and a Python file
# with an unused import fail, each named with its line; tests/abi_fixture/ is not checked.
set -uo pipefail
runfiles=$TEST_SRCDIR/$TEST_WORKSPACE
style=$runfiles/tools/style.sh
tree=$TEST_TMPDIR/tree
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# Runs style.sh MODE on the tree; expects exit status WANT (0 or nonzero) and, when given,
# TEXT in its output.
expect() {
  local mode=$1 want=$2 text=${3:-}
  local out rc
  out=$(bash "$style" "$mode" "$tree" 2>&1)
  rc=$?
  echo "--- style.sh $mode (exit $rc):"
  echo "$out"
  if [ "$want" = 0 ] && [ $rc -ne 0 ]; then fail "$mode failed on a clean tree"; fi
  if [ "$want" != 0 ] && [ $rc -eq 0 ]; then fail "$mode passed; expected it to fail"; fi
  if [ -n "$text" ] && ! grep -qF -- "$text" <<<"$out"; then fail "$mode did not say '$text'"; fi
}

rm -rf "$tree"
mkdir -p "$tree/src" "$tree/tests/abi_fixture"
cp "$runfiles/.clang-format" "$runfiles/.flake8" "$tree/"
cat >"$tree/src/good.cc" <<'CC'
#include <vector>

int Sum(const std::vector<int>& values) {
  int total = 0;
  for (int v : values) total += v;
  return total;
}
CC
cat >"$tree/src/good.py" <<'PY'
import os


def home():
    return os.environ.get("HOME", "")
PY
# Misformatted, but a frozen fixture: must not be checked.
printf 'int  frozen (void) ;\n' >"$tree/tests/abi_fixture/frozen.h"
git -C "$tree" init -q
git -C "$tree" add -A

expect check 0
expect lint 0

# A misformatted line 3 in a tracked C++ file, and an unused import on line 1 of a tracked
# Python file.
printf '#include <vector>\n\nint  Twice(int x)   { return 2*x; }\n' >"$tree/src/bad.cc"
printf 'import sys\n\n\ndef f():\n    return 1\n' >"$tree/src/bad.py"
git -C "$tree" add -A
expect check 1 "src/bad.cc:3:"
expect lint 1 "src/bad.py:1:1: F401 'sys' imported but unused"
# The clean files are not reported alongside.
bash "$style" check "$tree" 2>&1 | grep -q "good.cc" && fail "check reported the clean good.cc"
bash "$style" check "$tree" 2>&1 | grep -q "frozen.h" && fail "check looked at tests/abi_fixture/"

# format rewrites the file; then check passes.
bash "$style" format "$tree" 2>&1 && grep -qxF 'int Twice(int x) { return 2 * x; }' "$tree/src/bad.cc" ||
  fail "format did not rewrite src/bad.cc"
expect check 0
[ "$(cat "$tree/tests/abi_fixture/frozen.h")" = 'int  frozen (void) ;' ] || fail "format rewrote tests/abi_fixture/"

# Outside a git checkout the tracked files cannot be listed: a clear refusal, not a pass.
rm -rf "$tree/.git"
expect check 1 "is not a git checkout"

[ $failures -eq 0 ] && echo "PASS" || { echo "$failures failure(s)"; exit 1; }
