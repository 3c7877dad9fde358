#!/bin/bash
# Session 21, call a. dist/prep: main 3c9b193 (module_refill resolving devices as the tensors name them, the Hessian
# kernel's stages 2 deep: neither run on a GPU before). The GPU tests of the Hessian, the prefetch and the GPTQModel
# integration; then issue 23's set in one lease: GPTQModel's loop with qlink at 2 / 8 / 4 layers twice (tensor,
# switch interval 1e-4), alone at 2 / 4 / 8, each its own process, models made in processes of their own.
# carry: dist/prep dist/call22a.sh
O=$1; . dist/prep/bench/hosts/call_lib.sh
{
mk() { run make$1 60 python3 -c "import sys; sys.path.insert(0, '$P/bench/hosts'); from common import make_llama; make_llama('/tmp/llama7b-$1layers', layers=$1)"; }
mk 2; mk 4; mk 8
run tests 60 python3 -m pytest -q -rf -p no:cacheprovider $P/tests/python/test_cuda_hessian.py $P/tests/python/test_integration_gptqmodel_prefetch.py $P/tests/python/test_integration_gptqmodel.py --qlink-library $P/python/qlink/lib/libqlink.so
cd $P/bench/hosts
q() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --switch-interval 1e-4 --out $R/$name.json "$@"; }
a() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --out $R/$name.json "$@"; }
q 2 q2a 40
q 8 q8a 50
q 4 q4a 45
a 2 alone2 60
q 2 q2b 40
q 8 q8b 50
q 4 q4b 45
a 4 alone4 100
a 8 alone8 160
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
