#!/bin/bash
# Session 18, last call: GPTQModel's 4-layer loop (switch 1e-4) timed and busy (device-only profiler, the loop's
# mark kernel found by its name's part): as GPTQModel sets the allocator (expandable segments) and without
# expandable segments (PYTORCH_ALLOC_CONF set first: GPTQModel keeps it), with torch's intra-op threads at 1
# (OMP_NUM_THREADS), and with finished layers landing pageable; then AutoRound's tuning with qlink once more. carry: dist/prep dist/call20b.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-360}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 2 $R/$name.log; }
cd $P/bench/hosts
q() { local env=$1 name=$2 lim=$3; shift 3; run $name $lim env $env python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --qlink --strict --precision tensor --switch-interval 1e-4 --out $R/$name.json "$@"; }
{
nproc; python3 -c "import torch; print('torch threads', torch.get_num_threads())"
NOEXP=PYTORCH_ALLOC_CONF=max_split_size_mb:256,garbage_collection_threshold:0.7
q X=1 t4 70
q $NOEXP t4_noexp 45
q OMP_NUM_THREADS=1 t4_omp1 45
q X=1 t4_pageable 45 --landing pageable
q X=1 b4 50 --profile $R/b4_ops.txt --device-only
q $NOEXP b4_noexp 50 --profile $R/b4_noexp_ops.txt --device-only
q $NOEXP i4_noexp 60 --profile $R/i4_noexp_ops.txt --idle $R/i4_noexp.txt
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
