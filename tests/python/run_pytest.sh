#!/bin/bash
# Runs the Python tests with Debian's python3 (it has torch; the pyenv python3 first on
# PATH does not) against the libqlink.so built by Bazel, reporting JUnit XML to Bazel.
set -euo pipefail
here="$(dirname "$0")"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$here" \
  --qlink-library "$here/../../libqlink.so" ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"}
