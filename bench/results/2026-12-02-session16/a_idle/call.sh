#!/bin/bash
# Session 16 call A (main e89be27 + the idle sampler): the GPU tests and the 384-solve call
# checked against solves alone (e89be27's staged-weight release), then where the GPU waits:
# GPTQModel's dense loop at 4 layers (`tensor`, profiled, --idle) and AutoRound's tuning
# with qlink (warm-up, timed, profiled with --idle).
# carry: dist/prep dist/call16a.sh dist/conformance_test dist/libqlink_backend_cuda.so
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R; D=$PWD/dist
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-420}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
{
run conformance 30 $D/conformance_test --backend=$P/python/qlink/lib/libqlink_backend_cuda.so
cd $P/bench
run moe_check 40 python3 moe_solve_bench.py --library $P/python/qlink/lib/libqlink.so --batches 1 --reps 3 --check-alone 24
cd $P/bench/hosts
run pytest_gpu 100 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_cuda_quant.py ../../tests/python/test_integration_gptqmodel_routed.py ../../tests/python/test_integration_autoround.py --qlink-library ../../python/qlink/lib/libqlink.so
run tensor2 60 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink --strict --precision tensor --out $R/tensor2.json
run tensor4_idle 80 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --qlink --strict --precision tensor --profile $R/tensor4_ops.txt --idle $R/tensor4_idle.txt --out $R/tensor4_idle.json
run ar_idle 170 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --profile $R/ar_ops.txt --idle $R/ar_idle.txt --out $R/ar_idle.json
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
