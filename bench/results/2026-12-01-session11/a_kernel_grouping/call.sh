#!/bin/bash
# Session 11 call A (loop-next): GPU tests of the Hessian kernel, the precision table, the
# 2-layer loop (ieee_fp32 x2, tensor x2 one sampled, host), codes compared; moe_check if time.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python
cd $P/bench/hosts
codes=/tmp/qlink_codes; mkdir -p $codes
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-560}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
q() { local n=$1 p=$2 name=$3; shift 3; run $name 150 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $p --out $R/$name.json "$@"; }
{
nvidia-smi --query-gpu=name,memory.total --format=csv
run pytest_hessian 120 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_cuda_hessian.py ../../tests/python/test_cuda_quant.py --qlink-library ../../python/qlink/lib/libqlink.so
run hprec 150 python3 ../hessian_precision.py --library ../../python/qlink/lib/libqlink.so --json $R/hprec.json --markdown $R/hprec.md
q 2 ieee_fp32 warm
q 2 ieee_fp32 qlink2 --codes $codes/qlink2.pt
q 2 tensor qlink2_tensor --codes $codes/qlink2_tensor.pt
q 2 tensor qlink2_tensor_samples --samples-out $R/qlink2_tensor_samples.txt
run host2 150 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --codes $codes/host2.pt --out $R/host2.json
run codes_ieee_vs_host 60 python3 compare_codes.py $R/host2.json $codes/host2.pt $R/qlink2.json $codes/qlink2.pt $R/codes_ieee_vs_host.json
run codes_tensor_vs_ieee 60 python3 compare_codes.py $R/qlink2.json $codes/qlink2.pt $R/qlink2_tensor.json $codes/qlink2_tensor.pt $R/codes_tensor_vs_ieee.json
run codes_tensor_vs_host 60 python3 compare_codes.py $R/host2.json $codes/host2.pt $R/qlink2_tensor.json $codes/qlink2_tensor.pt $R/codes_tensor_vs_host.json
run moe_check 120 python3 check_defuser.py --model /tmp/qwen3moe-2layers
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
