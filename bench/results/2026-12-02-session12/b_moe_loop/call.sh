#!/bin/bash
# Session 12 call B: issue 20's loop on the Qwen3-MoE model: with qlink (branch
# moe-solve-ahead: a layer's experts in one engine call) at 2 and 4 layers, then GPTQModel
# alone at 2 layers (its log prints each layer's first solve: the slope even if cut).
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
N=/tmp/pn; [ -d $N ] || { cp -r $P $N; rm -rf $N/python/qlink; cp -r $P/python_next/qlink $N/python/; }
export PYTHONPATH=$P/python
cd $P/bench/hosts
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-575}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
m() { local n=$1 name=$2 script=$3; shift 3; run $name ${LIM:-150} python3 $script --model /tmp/qwen3moe-${n}layers --layers $n --model-kind qwen3_moe --out $R/$name.json "$@"; }
{
m 2 moe_next2 $N/bench/hosts/gptqmodel_run.py --qlink --strict
m 4 moe_next4 $N/bench/hosts/gptqmodel_run.py --qlink --strict
LIM=600 m 2 moe_host2 gptqmodel_run.py
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
