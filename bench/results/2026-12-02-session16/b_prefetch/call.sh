#!/bin/bash
# Session 16 call B (main c9e0574: layer_prefetch, streamed one-time moves): the copies and
# prefetch GPU tests, then GPTQModel's dense loop at 2 layers (warm) and 4 layers profiled
# with --idle (where the GPU still waits), digests against call A's.
# carry: dist/prep dist/call16b.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-200}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
cd $P/bench/hosts
{
run pytest_gpu 60 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_integration_gptqmodel_copies.py ../../tests/python/test_integration_gptqmodel_prefetch.py --qlink-library ../../python/qlink/lib/libqlink.so
run tensor2 50 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink --strict --precision tensor --out $R/tensor2.json
run tensor4_idle 70 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --qlink --strict --precision tensor --profile $R/tensor4_ops.txt --idle $R/tensor4_idle.txt --out $R/tensor4_idle.json
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
