#!/bin/bash
# Prepared in session 18 for the next session's first call (re-lay dist/prep first:
# bash bench/hosts/prepare.sh dist/prep). Issue 23 in one lease with install(fixed_segments=True), the default
# since 0440a99 and never run on a GPU: GPTQModel alone at 2 and 4 layers, qlink at 2, 2, 4, 4, 8 (the slope),
# the 4-layer busy share (device-only profiler) with the patch and with --segments host, three digests.
# About 450 s. carry: dist/prep dist/call21a.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-540}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 2 $R/$name.log; }
cd $P/bench/hosts
q() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --switch-interval 1e-4 --out $R/$name.json "$@"; }
a() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --out $R/$name.json "$@"; }
{
run pytest_alloc 60 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_host_allocator.py ../../tests/python/test_integration_gptqmodel.py --qlink-library ../../python/qlink/lib/libqlink.so
q 2 q2a 60
q 4 q4a 60
q 4 b4 50 --profile $R/b4_ops.txt --device-only
q 4 b4_host 50 --segments host --profile $R/b4_host_ops.txt --device-only
q 2 q2b 35
q 4 q4b 40
q 8 q8 70
q 2 q2c 35
a 2 alone2 60
a 4 alone4 100
q 4 q4_pageable 40 --landing pageable
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
