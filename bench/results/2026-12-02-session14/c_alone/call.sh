#!/bin/bash
# Session 14 call C (the lease of call B): GPTQModel alone on the MoE model until its layer
# 1's first solve, on the dense model at 2 and 4 layers; with qlink (branch gptq-lanes) the
# dense model at 2 layers a third time and at 4 under torch.profiler (GPU busy).
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-550}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
N=$P/next; ln -sfn $P/hosts $N/hosts
export PYTHONPATH=$N/python QLINK_HOSTS_ROOT=$N
{
cd $P/bench/hosts
q() { local n=$1 name=$2; shift 2; run $name 100 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --out $R/$name.json "$@"; }
run moe_host2 330 python3 gptqmodel_run.py --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --stop-at-layer 1 --out $R/moe_host2.json
run host2 120 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --out $R/host2.json
q 2 tensor2_run3
run host4 150 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --out $R/host4.json
q 4 tensor4_profile --profile $R/tensor4_ops.txt
grep -H "first solve" $R/moe_*.log
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
