#!/bin/bash
# Session 14 call D: branch gptq-lanes with the upload fix (a host-written buffer waits for
# its last use on another lane): the 384-solve call on 8 lanes (GPTQModel's own solves of
# every 16th expert beside it: codes and losses), the GPU tests, the MoE loop with qlink at 2
# and 4 layers, the dense loop at 2 layers.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-300}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
N=$P/next; ln -sfn $P/hosts $N/hosts; rm -rf $N/bench; cp -r $P/bench $N/bench
export PYTHONPATH=$N/python QLINK_HOSTS_ROOT=$N
{
cd $N/bench/hosts
run moe_solve_lanes8 90 python3 ../moe_solve_bench.py --library $N/python/qlink/lib/libqlink.so --batches 8 --gptqmodel $P/hosts:$P/bench/hosts/standins --gptqmodel-every 16 --profile $R/moe_solve_lanes8_ops.txt --markdown $R/moe_solve_lanes8.md
m() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/qwen3moe-${n}layers --layers $n --model-kind qwen3_moe --out $R/$name.json "$@"; }
m 2 moe_qlink2 80 --qlink --strict
m 4 moe_qlink4 140 --qlink --strict
run pytest_lanes 60 python3 -m pytest -q -rf -p no:cacheprovider $N/tests/python/test_cuda_quant.py --qlink-library $N/python/qlink/lib/libqlink.so
grep -H "first solve" $R/moe_*.log
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
