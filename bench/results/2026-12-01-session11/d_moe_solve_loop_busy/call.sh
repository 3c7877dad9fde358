#!/bin/bash
# Session 11 call D: issue 20's 384 expert solves (GPTQModel's every 8th expert timed and
# scaled) and routed Hessians; the 4-layer loop profiled in both precisions (GPU busy).
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python
cd $P/bench/hosts
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-300}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
q() { local n=$1 p=$2 name=$3; shift 3; run $name 100 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $p --out $R/$name.json "$@"; }
{
run moe_solve 170 python3 ../moe_solve_bench.py --library ../../python/qlink/lib/libqlink.so --gptqmodel ../../hosts:standins --batches 8 --reps 2 --gptqmodel-every 8 --markdown $R/moe_solve.md
q 4 tensor qlink4_tensor_profile --profile $R/qlink4_tensor_ops.txt
q 4 ieee_fp32 qlink4_ieee_profile --profile $R/qlink4_ieee_ops.txt
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
