#!/bin/bash
# Backends built with another QLINK_BACKEND_INTERFACE_VERSION are refused; that protects
# only if the version moves whenever the interface does. Fails when device_backend.h or
# status.h changed since tests/backend_interface_pin.txt was written.
# Arguments: backends/device_backend.h backends/status.h tests/backend_interface_pin.txt
set -uo pipefail
header=$1 status=$2 pin=$3
version=$(sed -nE 's/^#define QLINK_BACKEND_INTERFACE_VERSION ([0-9]+)$/\1/p' "$header")
hash=$(cat "$header" "$status" | sha256sum | cut -d' ' -f1)
read -r pinned_version pinned_hash < <(grep -v '^#' "$pin")
if [ "$hash" = "$pinned_hash" ] && [ "$version" = "$pinned_version" ]; then
  echo "backend interface version $version, as pinned"
  exit 0
fi
cat <<MSG
The backend interface (backends/device_backend.h, backends/status.h) changed since version
${pinned_version} was pinned. If a backend built before this change would see it (a method
added, removed, reordered or retyped, a struct or a limit changed), bump
QLINK_BACKEND_INTERFACE_VERSION; a comment-only change keeps it. Then set the last line of
tests/backend_interface_pin.txt to:
MSG
if [ "$version" = "$pinned_version" ]; then
  echo "$((version + 1)) <sha256 of the two files after the bump>   (or, comments only: $version $hash)"
else
  echo "$version $hash"
fi
exit 1
