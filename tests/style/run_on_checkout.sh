#!/bin/bash
# Runs `tools/style.sh MODE` over the checkout this test was built from: the runfile of
# tools/style.sh links back to the source file, and style.sh takes its checkout from there.
set -euo pipefail
exec bash "$TEST_SRCDIR/$TEST_WORKSPACE/tools/style.sh" "$1"
