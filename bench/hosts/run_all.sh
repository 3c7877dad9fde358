#!/bin/bash
# On the accelerator machine, from a folder laid out by prepare.sh: every host run of
# bench/RESULTS.md, each in its own process, logs and JSON under OUTDIR.
#   bash bench/hosts/run_all.sh OUTDIR [PARTS]   PARTS: any of "pytest plan stress gptq ar ar0 gptq3"
#   (default all, in that order, the most wanted figures first where a lease is short)
set -uo pipefail
cd "$(dirname "$0")"
out=$1
parts=${2:-"pytest plan stress gptq ar ar0 gptq3"}
model=/tmp/llama7b-2layers
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=../../python
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpus.txt"
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  local start=$(date +%s.%N)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
  tail -n 4 "$out/$name.log"
}
for part in $parts; do
  case $part in
    pytest)
      run pytest 200 python3 -m pytest -q -p no:cacheprovider ../../tests/python --qlink-library ../../python/qlink/lib/libqlink.so ;;
    plan)
      run plan 60 python3 -m qlink plan --parallel auto --iters 200 --batch-size 8 --config '{"backend": "cuda"}'
      run plan2 60 python3 -m qlink plan --parallel 2 --iters 200 --batch-size 8 --config '{"backend": "cuda"}' ;;
    stress)
      for p in 1 2 3; do run stress$p 120 python3 stress_moves.py; done ;;
    gptq)  # GPTQModel alone, then with qlink (strict) GPTQ_QLINK_RUNS times (default 2)
      run gptq_host 300 python3 gptqmodel_run.py --model $model --out "$out/gptq_host.json"
      for r in $(seq 1 "${GPTQ_QLINK_RUNS:-2}"); do
        run gptq_qlink$r 300 python3 gptqmodel_run.py --model $model --qlink --strict --out "$out/gptq_qlink$r.json"
      done ;;
    gptq3)  # one more run with qlink: its tensors against the runs above
      run gptq_qlink3 300 python3 gptqmodel_run.py --model $model --qlink --strict --out "$out/gptq_qlink3.json" ;;
    ar)
      run ar_host 300 python3 autoround_run.py --model $model --iters 200 --out "$out/ar_host.json"
      run ar_qlink 300 python3 autoround_run.py --model $model --iters 200 --qlink auto --out "$out/ar_qlink.json" ;;
    ar0)
      run ar0_host 200 python3 autoround_run.py --model $model --iters 0 --out "$out/ar0_host.json"
      run ar0_qlink 200 python3 autoround_run.py --model $model --iters 0 --qlink auto --out "$out/ar0_qlink.json" ;;
  esac
done
python3 summarize.py "$out" | tee "$out/summary.md"
