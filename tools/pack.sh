#!/bin/bash
# Lays out, in one folder, everything the accelerator machine (no Bazel there) runs:
#   python/qlink/          qlink's Python package, with lib/ holding the optimized (-c opt)
#                          libqlink.so, its backends, the torch bridge, the qlink CLI (it loads
#                          the libqlink.so beside it) and the fake torch shim and cuSOLVER
#   bin/                   conformance_test, stress_test, abi_overhead, gptq_engine_test
#   blas.tar.xz            this machine's OpenBLAS (pthread) with its Fortran runtime, for
#                          gptq_engine_test's worlds test on the other machine's processor
#   rf/qlink               stress_test's runfiles (TEST_SRCDIR=rf): a link to ../python/qlink/lib
#   tests/python/          the Python tests (their GPU half checks the package's GPU paths)
#   docs/HOSTS.md          the seam tables a Python test compares with the code
#   corpus/                the trained model's text (bench/hosts/corpus.py), where this machine
#                          has python3.11-doc's sources (apt-get install python3.11-doc)
#   bench/                 the bench, baseline and host-run scripts (not results/)
#   tools/device.sh        the runner: bash tools/device.sh OUTDIR PART... from this folder
#   hosts/                 GPTQModel's package tree with gptqmodel_ext/ (its C++ sources,
#                          pack_block_cpu.cpp among them, which gptqmodel/utils/cpp.py builds at
#                          run time from <tree>/gptqmodel_ext/), AutoRound's auto_round and
#                          auto_round_extension: `git archive HEAD` of their fetched
#                          repositories, never committed; common.py's setup_paths finds them here
#   PACKED.txt             the commits it was packed from
# DEST is ignored by git where it is under dist/ (the default, dist/pack); carry it to the
# machine with the tree, or alone: nothing in it reads the source tree.
#   bash tools/pack.sh [DEST] [--hosts GPTQMODEL_GIT_DIR AUTOROUND_GIT_DIR | --no-hosts]
# The hosts' git directories default to /work/.mirror/ModelCloud+GPTQModel/repo and
# /work/.mirror/intel+auto-round/repo; where those are absent the hosts are left out, with a
# warning (the GPU parts of device.sh need no host).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
dest=dist/pack
gptqmodel=/work/.mirror/ModelCloud+GPTQModel/repo
autoround=/work/.mirror/intel+auto-round/repo
hosts=default
while [ $# -gt 0 ]; do
  case $1 in
    --hosts)
      [ $# -ge 3 ] || usage
      gptqmodel=$2 autoround=$3 hosts=given
      shift 3
      ;;
    --no-hosts)
      hosts=none
      shift
      ;;
    -h | --help) usage ;;
    -*) usage ;;
    *)
      dest=$1
      shift
      ;;
  esac
done
if [ "$hosts" != none ]; then
  for dir in "$gptqmodel" "$autoround"; do
    if ! git -C "$dir" rev-parse --verify -q HEAD >/dev/null 2>&1; then
      [ "$hosts" = given ] && { echo "pack.sh: $dir is not a git directory with a HEAD" >&2; exit 1; }
      echo "pack.sh: warning: $dir not found: hosts/ left out (the host parts will not run)" >&2
      hosts=none
    fi
  done
fi

bazel build -c opt //:plugin //:qlink //:libqlink_backend_fault.so //tests/python:libfake_torch_shim.so \
  //tests/python:libfake_cusolver.so //tests:conformance_test //tests:stress_test //bench:abi_overhead \
  //tests/quant:gptq_engine_test

# Only what this script lays out is replaced: DEST may hold other things (a wheel, a runner's output).
[ -n "$dest" ] || usage
mkdir -p "$dest"
rm -rf "${dest:?}/python" "${dest:?}/bin" "$dest/rf" "$dest/tests" "$dest/docs" "$dest/bench" "$dest/tools" \
  "$dest/hosts" "$dest/corpus" "$dest/PACKED.txt" "$dest/blas.tar.xz"
mkdir -p "$dest/python/qlink/lib" "$dest/bin" "$dest/rf" "$dest/tests" "$dest/docs" "$dest/bench" "$dest/tools"
cp -r python/qlink "$dest/python/"
cp -f bazel-bin/libqlink*.so bazel-bin/qlink bazel-bin/tests/python/libfake_torch_shim.so \
  bazel-bin/tests/python/libfake_cusolver.so "$dest/python/qlink/lib/"
cp -f bazel-bin/tests/conformance_test bazel-bin/tests/stress_test bazel-bin/bench/abi_overhead \
  bazel-bin/tests/quant/gptq_engine_test "$dest/bin/"
blas=/usr/lib/x86_64-linux-gnu
tar -cJhf "$dest/blas.tar.xz" -C "$blas" openblas-pthread/libopenblas.so.0 libgfortran.so.5 libquadmath.so.0
ln -s ../python/qlink/lib "$dest/rf/qlink"  # stress_test loads qlink/libqlink.so from its runfiles
cp -r tests/python "$dest/tests/"
cp docs/HOSTS.md "$dest/docs/"
if [ -d /usr/share/doc/python3.11/html/_sources ]; then
  python3 bench/hosts/corpus.py "$dest/corpus"
else
  echo "pack.sh: no python3.11-doc sources here: corpus/ left out (apt-get install python3.11-doc)" >&2
fi
cp bench/*.py bench/*.cu "$dest/bench/"
cp -r bench/baselines bench/hosts "$dest/bench/"
cp tools/device.sh "$dest/tools/"
{
  echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) from qlink $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes')"
} >"$dest/PACKED.txt"
if [ "$hosts" != none ]; then
  mkdir -p "$dest/hosts"
  git -C "$gptqmodel" archive HEAD gptqmodel gptqmodel_ext | tar -x -C "$dest/hosts"
  git -C "$autoround" archive HEAD auto_round auto_round_extension | tar -x -C "$dest/hosts"
  echo "GPTQModel $(git -C "$gptqmodel" rev-parse --short HEAD), AutoRound $(git -C "$autoround" rev-parse --short HEAD)" \
    >>"$dest/PACKED.txt"
fi
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
chmod -R u+w "$dest"
cat "$dest/PACKED.txt"
ls -la "$dest" "$dest/python/qlink/lib" "$dest/bin"
du -sh "$dest"
