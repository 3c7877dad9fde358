#!/bin/bash
# Session 15 call B (the lease of call A): issue 20's loop figures, the four-lane engine
# (branch gptq-lanes merged with main, 43d9be1): GPTQModel's loop on the Qwen3-MoE model with
# qlink at 2 and 4 layers, then GPTQModel alone until its layer 1's first solve.
# carry: dist/prep dist/call15b.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-585}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
cd $P/bench/hosts
{
m() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/qwen3moe-${n}layers --layers $n --model-kind qwen3_moe --out $R/$name.json "$@"; }
m 2 moe_qlink2 130 --qlink --strict
m 4 moe_qlink4 170 --qlink --strict
m 2 moe_host2 330 --stop-at-layer 1
grep -H "first solve" $R/moe_*.log
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
