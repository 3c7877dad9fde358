#!/bin/bash
# Session 16 call D (main c69b6f8), right after call E in its lease: GPTQModel's dense loop
# (the issue's 7B-dimension model, 128 x 2048 tokens, 4-bit g128, `tensor`): with qlink at
# 2 layers (warm-up of the lease, then again), 4 layers profiled with --idle (the GPU's busy
# share over the loop), 4 layers timed, GPTQModel alone at 2 and 4 layers, then 8 layers.
# carry: dist/prep dist/call16d.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-380}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 2 $R/$name.log; }
cd $P/bench/hosts
q() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --out $R/$name.json "$@"; }
{
q 2 tensor2 50
q 4 tensor4_idle 70 --profile $R/tensor4_ops.txt --idle $R/tensor4_idle.txt
q 2 tensor2_run2 40
q 4 tensor4 45
run host2 70 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --out $R/host2.json
run host4 110 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --out $R/host4.json
q 8 tensor8 60
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
