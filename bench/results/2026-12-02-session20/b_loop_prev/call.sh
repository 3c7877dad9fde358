#!/bin/bash
# Prepared in session 19: run right after call23a.sh in the same lease. dist/prev_py: abcf571's gptqmodel.py and
# gptqmodel_prefetch.py (before module_refill), laid over a copy of dist/prep: main with and without module_refill
# at 2 and 8 layers, and the branch at 8 and 4 (the slope's middle point). About 330 s.
# carry: dist/prep dist/stages_lib dist/prev_py dist/call23b.sh
O=$1; . dist/prep/bench/hosts/call_lib.sh
S=$PWD/dist/prep_stages; [ -d $S ] || { cp -r $P $S; cp dist/stages_lib/libqlink_backend_cuda.so $S/python/qlink/lib/; }
V=$PWD/dist/prep_prev; rm -rf $V; cp -r $P $V; cp dist/prev_py/*.py $V/python/qlink/integrations/
{
q() { local tree=$1 n=$2 name=$3 lim=$4; shift 4; (cd $tree/bench/hosts && export PYTHONPATH=$tree/python QLINK_HOSTS_ROOT=$tree && run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision tensor --switch-interval 1e-4 --out $R/$name.json "$@"); }
q $V 2 v2a 35
q $P 2 m2c 35
q $V 8 v8a 50
q $P 8 m8c 50
q $S 8 s8b 50
q $S 4 s4a 40
q $P 4 m4a 40
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
