#!/bin/bash
# The LibTorch host quantizes a 256 x 512 layer on the CPU backend; it exits nonzero unless
# every level is on the grid and GPTQ's output error is below round-to-nearest's.
set -euo pipefail
here="$(dirname "$0")"
exec "$here/../../tools/gptq_libtorch_host" "$here/../../libqlink.so" cpu 256 512
