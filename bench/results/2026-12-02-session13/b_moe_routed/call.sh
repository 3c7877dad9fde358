#!/bin/bash
# Session 13 call B: issue 20's loop on the Qwen3-MoE model with the routed_experts patch
# (one host read per MoE forward; grouped forwards for MoE): qlink at 2 layers, GPTQModel
# alone until its layer 1's first solve (one layer's time), qlink at 4 layers, qlink at 2
# with GPTQModel's batches kept (--group-rows 0: what grouping gives).
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python
cd $P/bench/hosts
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-565}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
m() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/qwen3moe-${n}layers --layers $n --model-kind qwen3_moe --out $R/$name.json "$@"; }
{
m 2 moe_qlink2 150 --qlink --strict
m 2 moe_host2 390 --stop-at-layer 1
m 4 moe_qlink4 200 --qlink --strict
m 2 moe_qlink2_ungrouped 150 --qlink --strict --group-rows 0
grep -H "first solve" $R/moe_*.log
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
