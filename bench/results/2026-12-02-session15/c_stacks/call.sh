#!/bin/bash
# Session 15 call C (the lease of A and B): the Python stacks behind the operators of
# AutoRound's run with qlink (issue 22: where its pageable host-to-device copies come from)
# and of GPTQModel's dense loop with qlink at 2 layers (issue 23: the idle host time), each
# profiled with stacks (the stacks slow the profiled runs; their times are not the loops').
# carry: dist/prep dist/call15c.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-585}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
cd $P/bench/hosts
{
run dense_stacks 200 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink --strict --precision tensor \
  --profile $R/dense_stacks_ops.txt --profile-stacks --out $R/dense_stacks.json
run ar_stacks 330 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto \
  --profile $R/ar_qlink_stacks.txt --profile-stacks --out $R/ar_stacks.json
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
