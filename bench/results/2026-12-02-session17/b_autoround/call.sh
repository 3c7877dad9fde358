#!/bin/bash
# Prepared in session 16 (dist/prep laid out at main 01e44ea; again if main moved): the GPU tests of AutoRound's
# integration and the copies (block_inputs' one allocation, host_staging's into=, dacd093,
# not yet run on a GPU), then AutoRound on the issue's model, iters=200: alone (warm-up +
# timed), with qlink (warm-up + timed + profiled with --idle), then iters=0 alone and with
# qlink. About 420 s.
# carry: dist/prep dist/call17b.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-585}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
cd $P/bench/hosts
{
run pytest_gpu 70 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_integration_autoround.py ../../tests/python/test_integration_gptqmodel_copies.py --qlink-library ../../python/qlink/lib/libqlink.so
run ar_host 130 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --out $R/ar_host.json
run ar_qlink 150 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --strict --profile $R/ar_ops.txt --idle $R/ar_idle.txt --out $R/ar_qlink.json
run ar0_host 70 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 0 --out $R/ar0_host.json
run ar0_qlink 70 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 0 --qlink auto --strict --out $R/ar0_qlink.json
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
