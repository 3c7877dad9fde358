#!/bin/bash
# Session 11 call B: qlink's packer vs GPTQModel's (check_pack), the loop at 2 layers
# (ieee_fp32 x3 one sampled, tensor, GPTQModel alone) with packed-buffer digests, codes
# compared, then 4 and 8 layers with qlink in both precisions. Tarred.
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python
cd $P/bench/hosts
codes=/tmp/qlink_codes; mkdir -p $codes
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-555}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 20 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
q() { local n=$1 p=$2 name=$3; shift 3; run $name 150 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $p --out $R/$name.json "$@"; }
{
run check_pack 120 python3 check_pack.py
q 2 ieee_fp32 qlink2_a --samples-out $R/qlink2_a_samples.txt
q 2 ieee_fp32 qlink2 --codes $codes/qlink2.pt
q 2 ieee_fp32 qlink2_c
q 2 tensor qlink2_tensor
run host2 150 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --codes $codes/host2.pt --out $R/host2.json
run codes_ieee_vs_host 60 python3 compare_codes.py $R/host2.json $codes/host2.pt $R/qlink2.json $codes/qlink2.pt $R/codes_ieee_vs_host.json
q 4 tensor qlink4_tensor
q 4 ieee_fp32 qlink4_ieee_fp32
q 8 tensor qlink8_tensor
q 8 ieee_fp32 qlink8_ieee_fp32
} > $R/run.txt 2>&1
cd $O && tar czf r.tgz r && rm -rf r
