#!/bin/bash
# Session 20, call c. dist/prep: main b9f67b2; dist/mma_lib: branch hessian-mma's CUDA backend (the promoted Hessian
# kernel on mma.sync, 4 warps of 64 x 64, 64-row stages 3 deep; bitwise equal to main's in dist/syrk's bench).
# The GPU Hessian tests and hessian_precision.py on the branch, then GPTQModel's loop at 2 / 4 / 8 layers,
# the branch (B) and main (M) alternating in one lease (the 2-layer digest must stay 7b648ae8).
# carry: dist/prep dist/mma_lib dist/call20c.sh
O=$1; . dist/prep/bench/hosts/call_lib.sh
B=$PWD/dist/prep_mma; rm -rf $B; cp -r $P $B; cp dist/mma_lib/libqlink_backend_cuda.so $B/python/qlink/lib/
{
mk() { run make$1 60 python3 -c "import sys; sys.path.insert(0, '$P/bench/hosts'); from common import make_llama; make_llama('/tmp/llama7b-$1layers', layers=$1)"; }
mk 2; mk 4; mk 8
run test_mma 60 env PYTHONPATH=$B/python python3 -m pytest -q -rf -p no:cacheprovider $B/tests/python/test_cuda_hessian.py $B/tests/python/test_integration_gptqmodel_prefetch.py --qlink-library $B/python/qlink/lib/libqlink.so
run hprec_mma 60 env PYTHONPATH=$B/python python3 $B/bench/hessian_precision.py --library $B/python/qlink/lib/libqlink.so --markdown $R/hprec_mma.md
q() { local tree=$1 n=$2 name=$3 lim=$4; shift 4; (cd $tree/bench/hosts && export PYTHONPATH=$tree/python QLINK_HOSTS_ROOT=$tree && run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --switch-interval 1e-4 --out $R/$name.json "$@"); }
q $B 2 b2a 35
q $P 2 m2a 35
q $B 8 b8a 50
q $P 8 m8a 50
q $B 4 b4a 40
q $B 2 b2b 35
q $B 8 b8b 50
q $P 4 m4a 40
q $B 4 b4b 40
q $P 2 m2b 35
q $B 2 b2c 35
q $P 8 m8b 50
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
