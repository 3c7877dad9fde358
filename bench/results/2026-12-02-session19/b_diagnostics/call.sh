#!/bin/bash
# Session 19, issue 22 diagnostics: the block's GEMMs one by one and fused (block_gemms.py), and a short qlink
# AutoRound run (iters 8: 3 eager iterations a block before the graph) profiled with stacks: where the bf16 fills
# and the other small kernels come from. About 150 s. carry: dist/prep dist/call22b.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-240}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
{
run gemms 60 python3 $P/bench/block_gemms.py
cd $P/bench/hosts
run ar_stacks 170 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 8 --runs 1 --qlink auto --strict --profile $R/ar_stacks_ops.txt --profile-stacks --out $R/ar_stacks.json
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
