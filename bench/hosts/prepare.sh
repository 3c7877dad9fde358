#!/bin/bash
# Lays out what the accelerator machine needs for the host runs in DEST (a folder git
# ignores, carried to the machine): qlink's Python package with the optimized plugin, its
# backends and torch bridge in qlink/lib, GPTQModel's and AutoRound's package trees from
# their fetched repositories (never committed), the stand-ins and these scripts.
#   bash bench/hosts/prepare.sh DEST [GPTQMODEL_GIT_DIR] [AUTOROUND_GIT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=$1
gptqmodel=${2:-/work/.mirror/ModelCloud+GPTQModel/repo}
autoround=${3:-/work/.mirror/intel+auto-round/repo}
bazel build -c opt //:plugin
rm -rf "$dest/python" "$dest/hosts" "$dest/bench"
mkdir -p "$dest/python/qlink/lib" "$dest/hosts" "$dest/bench"
cp -r python/qlink "$dest/python/"
find "$dest/python" -name __pycache__ -prune -exec rm -rf {} +
cp -f bazel-bin/libqlink*.so "$dest/python/qlink/lib/"
git -C "$gptqmodel" archive HEAD gptqmodel | tar -x -C "$dest/hosts"
git -C "$autoround" archive HEAD auto_round | tar -x -C "$dest/hosts"
cp -r bench/hosts "$dest/bench/"
chmod -R u+w "$dest"
du -sh "$dest"
