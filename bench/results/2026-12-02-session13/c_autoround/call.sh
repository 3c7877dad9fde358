#!/bin/bash
# Session 13 call C: issue 22 after causal attention and the compiled loss in the native
# loop: the GPU tests of the AutoRound integration, then AutoRound alone and with qlink
# (each a warm-up run and a timed one in its own process; qlink's also a profiled run),
# then iters=0 both ways.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python
cd $P/bench/hosts
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-540}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
M=/tmp/llama7b-2layers
{
run pytest_ar 90 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_integration_autoround.py ../../tests/python/test_autoround_causal.py --qlink-library ../../python/qlink/lib/libqlink.so
run ar_qlink 200 python3 autoround_run.py --model $M --iters 200 --qlink auto --profile $R/ar_qlink_ops.txt --out $R/ar_qlink.json
run ar_host 150 python3 autoround_run.py --model $M --iters 200 --out $R/ar_host.json
run ar0_qlink 60 python3 autoround_run.py --model $M --iters 0 --qlink auto --out $R/ar0_qlink.json
run ar0_host 70 python3 autoround_run.py --model $M --iters 0 --out $R/ar0_host.json
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
