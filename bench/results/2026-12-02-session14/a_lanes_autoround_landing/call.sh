#!/bin/bash
# Session 14 call A: branch gptq-lanes's GPU test and the 384-solve call main vs lanes (each
# profiled once more), the AutoRound GPU tests and its tuning with the precompiled loss and
# word gathers, and the dense loop's finished-layer landings pinned (main) vs pageable.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-540}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
# next/: the lanes branch's package and tests beside main's hosts and bench; pg/: main's package with the pageable landing
ln -sfn $P/hosts $P/next/hosts; rm -rf $P/next/bench; cp -r $P/bench $P/next/bench
rm -rf $P/pg; mkdir -p $P/pg; cp -r $P/python $P/pg/python; cp $P/alt/moves_pageable.py $P/pg/python/qlink/moves.py; ln -sfn $P/hosts $P/pg/hosts
{
nvidia-smi --query-gpu=name,memory.total --format=csv
cd $P/bench/hosts
PYTHONPATH=$P/next/python run pytest_lanes 90 python3 -m pytest -q -rf -p no:cacheprovider $P/next/tests/python/test_cuda_quant.py --qlink-library $P/next/python/qlink/lib/libqlink.so
PYTHONPATH=$P/python run pytest_ar 90 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_integration_autoround.py --qlink-library ../../python/qlink/lib/libqlink.so
PYTHONPATH=$P/python run moe_solve_main 100 python3 ../moe_solve_bench.py --library $P/python/qlink/lib/libqlink.so --batches 8 --profile $R/moe_solve_main_ops.txt --markdown $R/moe_solve_main.md
PYTHONPATH=$P/next/python run moe_solve_lanes 100 python3 $P/next/bench/moe_solve_bench.py --library $P/next/python/qlink/lib/libqlink.so --batches 8 --profile $R/moe_solve_lanes_ops.txt --markdown $R/moe_solve_lanes.md
export PYTHONPATH=$P/python
run ar_qlink 150 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --profile $R/ar_qlink_ops.txt --out $R/ar_qlink.json
g() { local root=$1 name=$2; shift 2; QLINK_HOSTS_ROOT=$root PYTHONPATH=$root/python run $name 100 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --qlink --strict --precision tensor --out $R/$name.json "$@"; }
g $P/pg tensor4_pageable_profile --profile $R/tensor4_pageable_ops.txt
g $P tensor4_pinned_profile --profile $R/tensor4_pinned_ops.txt
g $P/pg tensor4_pageable
g $P tensor4_pinned
run ar_host 110 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --out $R/ar_host.json
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
