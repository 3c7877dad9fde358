#!/bin/bash
# Session 18, first call after call19a: the split attention compiled (attention_split.py), GPTQModel's 4-layer
# loop's busy share with the device-only profiler (switch on / off), its idle by the loop thread's operators, and
# E1 again with room (2-layer profiled runs with the switch, --input-digests). carry: dist/prep dist/call20a.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-560}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
cd $P/bench/hosts
q() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --out $R/$name.json "$@"; }
{
run split 90 python3 ../attention_split.py --reps 10
q 4 t4_on 70 --switch-interval 1e-4
q 4 b4_on 50 --switch-interval 1e-4 --profile $R/b4_on_ops.txt --device-only
q 4 b4_off 50 --profile $R/b4_off_ops.txt --device-only
q 4 b4_on2 50 --switch-interval 1e-4 --profile $R/b4_on2_ops.txt --device-only
q 4 i4_on 90 --switch-interval 1e-4 --profile $R/i4_on_ops.txt --idle $R/i4_on.txt
for k in 1 2; do q 2 e1_on$k 80 --switch-interval 1e-4 --input-digests --profile $R/e1_on${k}_ops.txt --idle $R/e1_on$k.txt; done
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
