#!/bin/bash
# Prepared in session 19 for the next session. dist/prep: main b9f67b2 (module_refill, not yet run on a GPU);
# dist/stages_lib: branch hessian-stages 216b7c6's CUDA backend (main b9f67b2 + the promoted Hessian kernel's 4-stage ring and zero fragment,
# the same sums in the same order). Re-lay dist/prep only if main moved (bash bench/hosts/prepare.sh dist/prep).
# Issue 23's slope: the Hessian kernel was 1.49 s of the 4-layer loop's kernels (0.37 s a layer). One lease with
# call23b.sh: the prefetch and Hessian GPU tests (main, branch), hessian_precision.py (main, branch), GPTQModel's
# loop on the branch (2-layer digest must stay 7b648ae8) and on main at 2 and 8 layers. About 480 s.
# carry: dist/prep dist/stages_lib dist/call23a.sh
O=$1; . dist/prep/bench/hosts/call_lib.sh
S=$PWD/dist/prep_stages; rm -rf $S; cp -r $P $S; cp dist/stages_lib/libqlink_backend_cuda.so $S/python/qlink/lib/
{
mk() { run make$1 60 python3 -c "import sys; sys.path.insert(0, '$P/bench/hosts'); from common import make_llama; make_llama('/tmp/llama7b-$1layers', layers=$1)"; }
mk 2; mk 4; mk 8
run test_main 90 python3 -m pytest -q -rf -p no:cacheprovider $P/tests/python/test_integration_gptqmodel_prefetch.py $P/tests/python/test_cuda_hessian.py --qlink-library $P/python/qlink/lib/libqlink.so
run test_stages 60 env PYTHONPATH=$S/python python3 -m pytest -q -rf -p no:cacheprovider $S/tests/python/test_cuda_hessian.py --qlink-library $S/python/qlink/lib/libqlink.so
run hprec_main 60 python3 $P/bench/hessian_precision.py --library $P/python/qlink/lib/libqlink.so --markdown $R/hprec_main.md
run hprec_stages 60 env PYTHONPATH=$S/python python3 $S/bench/hessian_precision.py --library $S/python/qlink/lib/libqlink.so --markdown $R/hprec_stages.md
q() { local tree=$1 n=$2 name=$3 lim=$4; shift 4; (cd $tree/bench/hosts && export PYTHONPATH=$tree/python QLINK_HOSTS_ROOT=$tree && run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --switch-interval 1e-4 --out $R/$name.json "$@"); }
q $S 2 s2a 35
q $P 2 m2a 35
q $S 8 s8a 50
q $P 8 m8a 50
q $S 2 s2b 35
q $P 8 m8b 50
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
