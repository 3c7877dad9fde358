#!/bin/bash
# Session 19, one lease: issue 22's pair (AutoRound alone, then with qlink and a profiled run; each a warm-up then a
# timed run in its own process), then issue 23's slope runs again (GPTQModel's loop with qlink at 8, 8, 2, 2 layers;
# each model made first in a process of its own). About 430 s. carry: dist/prep dist/call22d.sh
O=$1; . dist/prep/bench/hosts/call_lib.sh
{
mk() { run make$1 60 python3 -c "import sys; sys.path.insert(0, '$P/bench/hosts'); from common import make_llama; make_llama('/tmp/llama7b-$1layers', layers=$1)"; }
mk 2
cd $P/bench/hosts
run ar_host 150 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --out $R/ar_host.json
run ar_qlink 150 python3 autoround_run.py --model /tmp/llama7b-2layers --iters 200 --qlink auto --strict --profile $R/ar_ops.txt --idle $R/ar_idle.txt --out $R/ar_qlink.json
q() { local n=$1 name=$2 lim=$3; shift 3; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --switch-interval 1e-4 --out $R/$name.json "$@"; }
mk 8
q 8 q8d 50
q 2 q2e 35
q 8 q8e 50
q 2 q2f 35
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
