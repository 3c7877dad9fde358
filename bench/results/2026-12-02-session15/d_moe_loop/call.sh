#!/bin/bash
# Session 15 call D: issue 20's loop figures in one lease with main's engine (one stream a
# device: call B's four-lane engine faulted at 4 layers): GPTQModel alone until its layer 1's
# first solve, then GPTQModel's MoE loop with qlink at 2 and 4 layers; then the lanes branch
# with its solver calls serialized across lanes (dist/ev4: four lanes, dist/ev8: eight) on
# the 384-solve call, 24 linears checked bit for bit against their solves alone.
# carry: dist/prep dist/ev4 dist/ev8 dist/call15d.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-588}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 15 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; grep -m3 -i "illegal\|one call:\|alone:\|first solve" $R/$name.log; }
cd $P/bench/hosts
{
m() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/qwen3moe-${n}layers --layers $n --model-kind qwen3_moe --out $R/$name.json "$@"; }
m 2 moe_host2 340 --stop-at-layer 1
m 2 moe_qlink2 80 --qlink --strict
m 4 moe_qlink4 120 --qlink --strict
for v in ev8 ev4; do
  run solve_$v 25 python3 ../moe_solve_bench.py --library $PWD/../../../$v/libqlink.so --batches 1 --reps 3 --check-alone 24
done
grep -H "first solve" $R/moe_*.log
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
