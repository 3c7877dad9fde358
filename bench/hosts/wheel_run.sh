#!/bin/bash
# On the accelerator machine: the qlink wheel (tools/wheel.sh, carried in dist/wheel/)
# installed into a fresh venv that sees pip's PyTorch (--system-site-packages), `qlink env`,
# then GPTQModel's quantization of the issue's model (gptqmodel_run.py) in the same lease,
# alternately: with install() in the script (--qlink --strict) and with no qlink line in
# it under `qlink run --strict` (--guards). Both import qlink from the venv only: the
# prepared folder's python/ is kept off the path. Writes OUTDIR/{env.txt, install*.json,
# run*.json, run*_report.json, compare.txt}.
#   bash bench/hosts/wheel_run.sh PREPARED_DIR OUTDIR [WHEEL]
#   PREPARED_DIR: laid out by tools/pack.sh (its hosts/ holds GPTQModel's tree)
#   WHEEL_RUNS: how many pairs (default 2)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prepared=$(cd "$1" && pwd)
mkdir -p "$2" && out=$(cd "$2" && pwd)
wheel=${3:-$(ls "$here"/../../dist/wheel/qlink-*.whl | tail -n 1)}
model=/tmp/llama7b-2layers
unset PYTHONPATH
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

echo "=== venv with $wheel"
rm -rf "$out/venv"
python3 -m venv --system-site-packages --without-pip "$out/venv" || exit 1
# When python3 is itself a venv's (PyTorch pip-installed into one, as on the GPU machine),
# --system-site-packages reaches the base interpreter's packages, not that venv's: a .pth
# file makes the new venv see them, as a user's environment with PyTorch would.
parent=$(python3 -c "import site; print(site.getsitepackages()[0])")
"$out/venv/bin/python" -c "import torch" 2>/dev/null ||
  echo "$parent" > "$("$out/venv/bin/python" -c "import site; print(site.getsitepackages()[0])")/parent_site.pth"
pip=("$out/venv/bin/python" -m pip)  # the system's pip, seen through --system-site-packages, else --python
"${pip[@]}" --version > /dev/null 2>&1 || pip=(python3 -m pip --python "$out/venv/bin/python")
"${pip[@]}" install --no-index --no-deps "$wheel" || exit 1
"$out/venv/bin/python" -c "import numpy, torch; print('numpy', numpy.__version__, 'torch', torch.__version__)" || exit 1
qlink="$out/venv/bin/qlink"
"$qlink" --version
PYTHONPATH="$prepared/hosts" "$qlink" env 2>&1 | tee "$out/env.txt"  # GPTQModel's tree seen, as a user's install

# GPTQModel's tree and the stand-ins, and no python/: qlink comes from the venv.
mkdir -p "$out/root" && ln -sfn "$prepared/hosts" "$out/root/hosts"
cat > "$out/run_config.json" <<'JSON'
{"integrations": ["gptqmodel"], "qlink": {"backend": "cuda", "log_level": "warn"}}
JSON
cd "$here"
timed() {  # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  timeout 400 "$@" > "$out/$name.log" 2>&1
  echo "=== $name rc=$?"
  tail -n 12 "$out/$name.log"
}
for r in $(seq 1 "${WHEEL_RUNS:-2}"); do
  timed install$r env QLINK_HOSTS_ROOT="$out/root" "$out/venv/bin/python" gptqmodel_run.py --model $model --qlink \
    --strict --out "$out/install$r.json"
  # qlink run refuses unknown QLINK_ variables: the hosts' root goes in through env after it.
  timed run$r "$qlink" run --strict --config "$out/run_config.json" --report "$out/run${r}_report.json" -- \
    env QLINK_HOSTS_ROOT="$out/root" "$out/venv/bin/python" gptqmodel_run.py --model $model --guards \
    --out "$out/run$r.json"
done
"$out/venv/bin/python" compare_wheel_runs.py "$out" | tee "$out/compare.txt"
