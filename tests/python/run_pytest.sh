#!/bin/bash
# Runs the Python tests with Debian's python3 (it has torch; the pyenv python3 first on
# PATH does not) against the libqlink.so built by Bazel, reporting JUnit XML to Bazel; the
# header's layout dump checks the package's ctypes mirror of it.
set -euo pipefail
here="$(dirname "$0")"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$here" "$@" \
  --qlink-library "$here/../../libqlink.so" --layout-dump "$here/../abi_compat/layout_json" ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"}
