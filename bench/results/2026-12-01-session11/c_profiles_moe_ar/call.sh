#!/bin/bash
# Session 11 call C: check_pack; GPU busy of the 2-layer loop (tensor, ieee_fp32, profiled);
# issue 20: moe_check, moe_solve; GPTQModel alone at 4 layers; issue 22 ar_stacks if time.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python
cd $P/bench/hosts
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-540}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
q() { local n=$1 p=$2 name=$3; shift 3; run $name 150 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $p --out $R/$name.json "$@"; }
{
run check_pack 90 python3 check_pack.py
q 2 tensor qlink2_tensor_profile --profile $R/qlink2_tensor_ops.txt
q 2 ieee_fp32 qlink2_ieee_profile --profile $R/qlink2_ieee_ops.txt
run moe_check 90 python3 check_defuser.py --model /tmp/qwen3moe-2layers
run moe_solve 220 python3 ../moe_solve_bench.py --library ../../python/qlink/lib/libqlink.so --gptqmodel ../../hosts:standins --batches 32 --reps 2 --markdown $R/moe_solve.md
run host4 150 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --out $R/host4.json
run ar_stacks 200 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --profile $R/ar_qlink_stacks.txt --profile-stacks --out $R/ar_stacks.json
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
