#!/bin/bash
# Session 12 call A: gptq_pack's GPU test; branch moe-solve-ahead (with loop-rehome) on the
# dense loop: ieee_fp32 digest vs effa2b73, both precisions at 2/4/8 layers, tensor profiled
# (GPU busy over the layer loop); main's ieee 2L and GPTQModel alone 2L/4L in the same lease.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
N=/tmp/pn; rm -rf $N; cp -r $P $N; rm -rf $N/python/qlink; cp -r $P/python_next/qlink $N/python/
export PYTHONPATH=$P/python
cd $P/bench/hosts
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-470}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
q() { local n=$1 p=$2 name=$3; shift 3; run $name 100 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $p --out $R/$name.json "$@"; }
qn() { local n=$1 p=$2 name=$3; shift 3; run $name 100 python3 $N/bench/hosts/gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $p --out $R/$name.json "$@"; }
{
nvidia-smi --query-gpu=name,memory.total --format=csv
run pytest_quant 90 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_cuda_quant.py --qlink-library ../../python/qlink/lib/libqlink.so
qn 2 ieee_fp32 next_ieee2
qn 2 tensor next_tensor2
qn 4 tensor next_tensor4_profile --profile $R/next_tensor4_ops.txt
q 2 ieee_fp32 main_ieee2
qn 4 ieee_fp32 next_ieee4
qn 4 tensor next_tensor4
run host2 120 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --out $R/host2.json
qn 8 tensor next_tensor8
run host4 130 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --out $R/host4.json
qn 8 ieee_fp32 next_ieee8
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
