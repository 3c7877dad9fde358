#!/bin/bash
# Session 14 call B: branch gptq-lanes (Hessians spread over lanes by cost, up to 8): its GPU
# test, the 384-solve call at 4 lanes and at 8, then GPTQModel's loop with it: the MoE model
# with qlink at 2 and 4 layers, the dense 7B model (tensor) at 2 (twice), 4 and 8 layers.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-520}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
N=$P/next; ln -sfn $P/hosts $N/hosts; rm -rf $N/bench; cp -r $P/bench $N/bench
rm -rf $P/l4; cp -r $N/python/qlink/lib $P/l4; cp $P/alt/libqlink_lanes4.so $P/l4/libqlink.so
export PYTHONPATH=$N/python QLINK_HOSTS_ROOT=$N
{
nvidia-smi --query-gpu=name,memory.total --format=csv
cd $N/bench/hosts
run pytest_lanes 90 python3 -m pytest -q -rf -p no:cacheprovider $N/tests/python/test_cuda_quant.py --qlink-library $N/python/qlink/lib/libqlink.so
run moe_solve_lanes4 80 python3 ../moe_solve_bench.py --library $P/l4/libqlink.so --batches 8 --markdown $R/moe_solve_lanes4.md
run moe_solve_lanes8 80 python3 ../moe_solve_bench.py --library $N/python/qlink/lib/libqlink.so --batches 8 --profile $R/moe_solve_lanes8_ops.txt --markdown $R/moe_solve_lanes8.md
m() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/qwen3moe-${n}layers --layers $n --model-kind qwen3_moe --out $R/$name.json "$@"; }
m 2 moe_qlink2 120 --qlink --strict
m 4 moe_qlink4 170 --qlink --strict
q() { local n=$1 name=$2; shift 2; run $name 100 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --out $R/$name.json "$@"; }
q 2 tensor2
q 4 tensor4
q 2 tensor2_run2
q 8 tensor8
grep -H "first solve" $R/moe_*.log
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
