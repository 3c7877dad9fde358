#!/bin/bash
# Prepared in session 17 for the next session's first call (re-lay dist/prep first:
# bash bench/hosts/prepare.sh dist/prep). Verifies ABI 1.9's v step inside the SignRound backward on the GPU
# (c1f58f5: the CUDA kernels never ran), times attention_split.py (AutoRound's 0/1 bias as two causal cuDNN
# attentions, never run on a GPU), AutoRound's pair with the fused step, and repeats the switch interval's
# profiled 2-layer run (E1: did call (c)'s odd digest come back?). About 520 s. carry: dist/prep dist/call19a.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-575}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
cd $P/bench/hosts
q() { local name=$1 lim=$2; shift 2; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink --strict --precision tensor --input-digests --out $R/$name.json "$@"; }
{
run pytest_gpu 90 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_cuda_quant.py ../../tests/python/test_signround.py ../../tests/python/test_integration_autoround.py --qlink-library ../../python/qlink/lib/libqlink.so
run split 60 python3 ../attention_split.py --reps 10
run ar_qlink 130 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --strict --profile $R/ar_ops.txt --idle $R/ar_idle.txt --out $R/ar_qlink.json
run ar_host 110 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --out $R/ar_host.json
for k in 1 2 3; do q e1_on$k 40 --switch-interval 1e-4 --profile $R/e1_on${k}_ops.txt --idle $R/e1_on$k.txt; done
q e1_off 40 --profile $R/e1_off_ops.txt --idle $R/e1_off.txt
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
