#!/bin/bash
# Session 19, issue 22: the 4096-wide GEMMs' layouts under cuBLAS and cuBLASLt (block_gemms.py --layouts), then
# AutoRound with qlink at iters 200 with PyTorch's default BLAS and with cuBLASLt preferred, each a warm-up and a
# timed run in its own process; the compiled block's generated code (its GEMM calls' layouts). Issue 23: the
# models made first in a process of their own, then GPTQModel's loop with qlink at 8 (twice), 4 and 2 layers. About 420 s.
# carry: dist/prep dist/call22c.sh
O=$1; P=$PWD/dist/prep; R=$O/r; mkdir -p $R
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-560}))
run() { local name=$1 lim=$2; shift 2; local left=$((DEADLINE - $(date +%s))); [ $left -lt 10 ] && { echo "=== $name skipped"; return; }; [ $lim -gt $left ] && lim=$left
  echo "=== $name"; local s=$(date +%s.%N); timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s"; tail -n 3 $R/$name.log; }
{
run make 90 python3 -c "import sys; sys.path.insert(0, '$P/bench/hosts'); from common import make_llama; [make_llama('/tmp/llama7b-%dlayers' % n, layers=n) for n in (2, 4, 8)]"
run layouts 60 python3 $P/bench/block_gemms.py --layouts
cd $P/bench/hosts
run ar_qlink 130 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --strict --out $R/ar_qlink.json
run ar_qlink_lt 130 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --strict --blas cublaslt --out $R/ar_qlink_lt.json
q() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --switch-interval 1e-4 --out $R/$name.json "$@"; }
q 8 q8b 50
q 8 q8c 50
q 4 q4c 40
q 2 q2d 35
} > $R/run.txt 2>&1
cat $R/run.txt
C=$(python3 -c "from torch._inductor.runtime.cache_dir_utils import cache_dir; print(cache_dir())" 2>/dev/null)
mkdir -p $R/inductor; grep -rl "extern_kernels.mm\|aten.mm" $C --include=*.py 2>/dev/null | head -20 | while read f; do cp $f $R/inductor/; done
ls $R/inductor | head
cd $O && tar czf r.tgz r && rm -rf r
