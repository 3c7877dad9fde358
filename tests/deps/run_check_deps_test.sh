#!/bin/bash
# Runs test_check_deps.py with Debian's python3 (it has torch) from the test's runfiles.
set -euo pipefail
here="$(dirname "$0")"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$here/test_check_deps.py" --rootdir "$here" \
  ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"}
