#!/bin/bash
# Session 17, warm follow-up of call18b: GPTQModel alone at 2 and 4 layers, qlink 2 layers again, AutoRound iters=0 pair.
# carry: dist/prep dist/call18c.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-250}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 2 $R/$name.log; }
cd $P/bench/hosts
{
run on2b 40 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink --strict --precision tensor --out $R/on2b.json
run alone2 60 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --out $R/alone2.json
run alone4 90 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --out $R/alone4.json
run ar0_qlink 50 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 0 --qlink auto --strict --out $R/ar0_qlink.json
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
