#!/bin/bash
# Prepared in session 16 for the next session's first call (dist/prep laid out at main 01e44ea; again if main moved:
# bash bench/hosts/prepare.sh dist/prep): the GPU tests of the session's new paths, then in
# one lease GPTQModel's dense loop at 4 layers with the layer read-ahead pinned, pageable and
# off (a warm-up 2-layer run first; each 4-layer run profiled with --idle, then timed). About
# 560 s; AutoRound's pair (alone, then --qlink auto --strict --profile --idle) is a second call.
# carry: dist/prep dist/call17a.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-585}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 2 $R/$name.log; }
cd $P/bench/hosts
q() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --out $R/$name.json "$@"; }
{
run pytest_gpu 60 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python/test_integration_gptqmodel_prefetch.py ../../tests/python/test_integration_gptqmodel_copies.py --qlink-library ../../python/qlink/lib/libqlink.so
q 2 tensor2 60
q 4 tensor4 80
for mode in pinned pageable off; do
  q 4 idle4_$mode 75 --read-ahead $mode --profile $R/idle4_${mode}_ops.txt --idle $R/idle4_$mode.txt
  q 4 time4_$mode 45 --read-ahead $mode
done
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
