#!/bin/bash
# Session 21, call d (its own lease). dist/prep: main 3c9b193. Call c's two ieee_fp32 4-layer runs differed
# (90083c37, as every earlier 4-layer ieee_fp32 run since session 9, and 7625a298: layer 0's o_proj first): five
# more with --input-digests (each solve's weight and merged Hessian digested) to find which input differs first.
# carry: dist/prep dist/call22d.sh
O=$1; . dist/prep/bench/hosts/call_lib.sh
{
run make4 60 python3 -c "import sys; sys.path.insert(0, '$P/bench/hosts'); from common import make_llama; make_llama('/tmp/llama7b-4layers', layers=4)"
cd $P/bench/hosts
for k in 1 2 3 4 5; do
run e4d$k 55 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --qlink --strict --precision ieee_fp32 --switch-interval 1e-4 --input-digests --out $R/e4d$k.json
done
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
