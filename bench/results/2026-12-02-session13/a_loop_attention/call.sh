#!/bin/bash
# Session 13 call A: the GPU tests (gptq_pack's host-input case, the routed loop), the dense
# loop with gptq_pack's stream fix (tensor at 2/4/8 + profiled 4, ieee at 2/4/8, GPTQModel
# alone 2/4 in the same lease), and what AutoRound's attention mask costs its tuning.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python
cd $P/bench/hosts
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-560}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
q() { local n=$1 p=$2 name=$3; shift 3; run $name 100 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $p --out $R/$name.json "$@"; }
{
nvidia-smi --query-gpu=name,memory.total --format=csv
run pytest_gpu 100 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_cuda_quant.py ../../tests/python/test_integration_gptqmodel_routed.py ../../tests/python/test_defuser_standin.py --qlink-library ../../python/qlink/lib/libqlink.so
q 2 tensor tensor2
q 4 tensor tensor4_profile --profile $R/tensor4_ops.txt
run host2 120 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --out $R/host2.json
q 4 tensor tensor4
q 8 tensor tensor8
run host4 130 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --out $R/host4.json
run attention 90 python3 ../attention_mask_cost.py
q 2 ieee_fp32 ieee2
q 4 ieee_fp32 ieee4
q 8 ieee_fp32 ieee8
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
