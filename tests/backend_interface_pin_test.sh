#!/bin/bash
# Backends built with another QLINK_BACKEND_INTERFACE_VERSION are refused; that protects
# only if the version moves whenever the interface does. Fails when any file of the
# interface changed since tests/backend_interface_pin.txt was written:
# backends/device_backend.h, backends/status.h, and the engines' per-vendor parts, which
# cross the same library boundary (DeviceBackend::GetQuantMath, GetSignRoundMath):
# quant/quant_math.h for GPTQ, quant/signround/signround_math_api.h for SignRound, with
# quant/kernels/signround_math.h, whose SignRoundConfig its calls take.
# Arguments: tests/backend_interface_pin.txt, then the interface's files, device_backend.h first.
set -uo pipefail
pin=$1
shift
header=$1
version=$(sed -nE 's/^#define QLINK_BACKEND_INTERFACE_VERSION ([0-9]+)$/\1/p' "$header")
hash=$(cat "$@" | sha256sum | cut -d' ' -f1)
read -r pinned_version pinned_hash < <(grep -v '^#' "$pin")
if [ "$hash" = "$pinned_hash" ] && [ "$version" = "$pinned_version" ]; then
  echo "backend interface version $version, as pinned"
  exit 0
fi
cat <<MSG
The backend interface ($*) changed since version ${pinned_version} was pinned. If a backend
built before this change would see it (a method added, removed, reordered or retyped, a
struct or a limit changed, a method's meaning changed), bump QLINK_BACKEND_INTERFACE_VERSION;
a comment-only change keeps it. Then set the last line of tests/backend_interface_pin.txt to:
MSG
if [ "$version" = "$pinned_version" ]; then
  echo "$((version + 1)) <sha256 of the files after the bump>   (or, comments only: $version $hash)"
else
  echo "$version $hash"
fi
exit 1
