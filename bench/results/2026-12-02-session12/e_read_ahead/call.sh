#!/bin/bash
# Session 12 call E (main 1011bec, checkpoint_reads): issue 23's loop, tensor and ieee_fp32,
# GPTQModel alone at 2/4 layers in the same lease; tensor 4L profiled (GPU busy).
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python
cd $P/bench/hosts
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-365}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
q() { local n=$1 p=$2 name=$3; shift 3; run $name 80 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $p --out $R/$name.json "$@"; }
{
q 2 tensor tensor2
if ! grep -q '"digest"' $R/tensor2.json 2>/dev/null; then  # checkpoint_reads failed: main before it
  echo "=== falling back to 49d68cc's package"; rm -rf $P/python/qlink; cp -r $P/python_prev/qlink $P/python/
  q 2 tensor tensor2_prev
fi
q 4 tensor tensor4_profile --profile $R/tensor4_ops.txt
run host2 100 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --out $R/host2.json
q 4 tensor tensor4
q 8 tensor tensor8
run host4 120 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --out $R/host4.json
q 2 ieee_fp32 ieee2
q 4 ieee_fp32 ieee4
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
