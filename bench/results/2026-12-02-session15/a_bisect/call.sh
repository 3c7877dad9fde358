#!/bin/bash
# Session 15 call A: where the eight-lane engine's illegal address comes from (QLINK_BISECT
# serializes one group of math calls across lanes: dist/bisect8/README.txt), the candidate fix
# (each handle's own cuBLAS workspace) at eight lanes, then the four-lane branch (merged with
# main, 43d9be1) on the 384-solve call with 24 linears checked bit for bit against their solves
# alone and GPTQModel's own solves of every 16th expert, and the branch's GPU tests.
# carry: dist/prep dist/bisect8 dist/bisect8ws dist/call15a.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R; B=$PWD/dist/bisect8; W=$PWD/dist/bisect8ws
export PYTHONUNBUFFERED=1 PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-580}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; grep -m3 -i "illegal\|one call\|alone\|passed\|failed" $R/$name.log; }
cd $P/bench
{
nvidia-smi --query-gpu=name,memory.total --format=csv
for m in none solver blas kernels all; do
  QLINK_BISECT=$m run bisect_$m 60 python3 moe_solve_bench.py --library $B/libqlink.so --batches 1 --reps 1 --experts 32
done
QLINK_BISECT=none run workspace8 60 python3 moe_solve_bench.py --library $W/libqlink.so --batches 1 --reps 3 --experts 128 --check-alone 24
run moe_solve_lanes4 200 python3 moe_solve_bench.py --library $P/python/qlink/lib/libqlink.so --batches 8 \
  --gptqmodel $P/hosts:$P/bench/hosts/standins --gptqmodel-every 16 --check-alone 24 --markdown $R/moe_solve_lanes4.md
run pytest_gpu 120 python3 -m pytest -q -rf -p no:cacheprovider $P/tests/python/test_cuda_quant.py \
  $P/tests/python/test_integration_gptqmodel_routed.py --qlink-library $P/python/qlink/lib/libqlink.so
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
