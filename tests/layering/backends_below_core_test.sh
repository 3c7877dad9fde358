#!/bin/bash
# Layering: backends/ is the layer below core/ (core loads backends, never the reverse), so
# no file under backends/ may include a core/ header or name a //core target. Arguments:
# every file under backends/ (//backends:sources), so a new file is checked as it lands.
set -uo pipefail
if [ $# -lt 10 ]; then
  echo "expected every file under backends/, got $# (is //backends:sources complete?)"
  exit 1
fi
offenders=$(grep -nE '#[[:space:]]*include[[:space:]]*[<"]core/|"//core[:/"]' "$@")
if [ -n "$offenders" ]; then
  echo "backends/ reaches into core/, the layer above it:"
  echo "$offenders"
  exit 1
fi
echo "$# files under backends/; none reaches into core/"
