#!/bin/bash
# Session 17, one call: AutoRound's 0/1 attention bias gathered vs expanded (attention_mask_cost); AutoRound
# on the issue's model with qlink (warm-up, timed, profiled --idle) and alone (warm-up, timed); GPTQModel's
# loop with qlink at 2 layers, 4 layers with the switch interval on (timed x2, profiled --idle) and off, 8 layers.
# carry: dist/prep dist/call18b.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-575}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 2 $R/$name.log; }
cd $P/bench/hosts
q() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --out $R/$name.json "$@"; }
{
run attn 45 python3 ../attention_mask_cost.py --reps 10
run ar_qlink 130 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --strict --profile $R/ar_ops.txt --idle $R/ar_idle.txt --out $R/ar_qlink.json
run ar_host 115 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --out $R/ar_host.json
q 2 on2 45
q 4 on4a 70
q 4 off4 40 --switch-interval off
q 4 on4b 40
q 4 idle4_on 70 --profile $R/idle4_on_ops.txt --idle $R/idle4_on.txt
q 8 on8 60
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
