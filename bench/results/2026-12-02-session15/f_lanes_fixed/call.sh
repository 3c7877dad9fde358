#!/bin/bash
# Session 15 call F: the lanes branch (a455e5d: main's fix of the backend's host copies
# merged, complete when they return) at eight lanes (dist/fx8) and four (dist/fx4): the
# conformance suite on the GPU, the 384-solve call (32 experts once; 128 experts with 24
# linears checked against their solves alone and GPTQModel's own solves of every 16th
# expert), then GPTQModel's MoE loop at 4 layers with eight lanes, strict.
# carry: dist/prep dist/fx4 dist/fx8 dist/call15f.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R; F8=$PWD/dist/fx8; F4=$PWD/dist/fx4
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-255}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; grep -m4 -i "illegal\|one call:\|alone:\|speedup\|first solve\|PASSED\|FAILED" $R/$name.log; }
{
run conformance 30 $F4/conformance_test --backend=$F8/libqlink_backend_cuda.so
cd $P/bench
run fx8_32 20 python3 moe_solve_bench.py --library $F8/libqlink.so --batches 1 --reps 1 --experts 32
run fx8_128 60 python3 moe_solve_bench.py --library $F8/libqlink.so --batches 8 --reps 3 \
  --gptqmodel $P/hosts:$P/bench/hosts/standins --gptqmodel-every 16 --check-alone 24 --markdown $R/fx8_128.md
run fx4_128 20 python3 moe_solve_bench.py --library $F4/libqlink.so --batches 1 --reps 3 --check-alone 24
cp -f $F8/*.so $P/python/qlink/lib/
cd $P/bench/hosts
run moe_qlink4_fx8 130 python3 gptqmodel_run.py --model /tmp/qwen3moe-4layers --layers 4 --model-kind qwen3_moe --qlink --strict --out $R/moe_qlink4_fx8.json
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
