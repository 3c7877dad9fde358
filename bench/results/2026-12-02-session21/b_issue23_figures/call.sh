#!/bin/bash
# Session 21, call b (its own lease, after call a). dist/prep: main 3c9b193. Issue 23's remaining figures on it:
# hessian_precision.py (the precision table's errors and times), the 4-layer loop's busy share (device-only
# profiler) and its idle time by the host's stacks, ieee_fp32 at 2 layers with codes against GPTQModel alone's
# (first layer >= 99.9 % equal), the tensor default's codes and losses against both, a third and fourth qlink run
# at 2 / 4 / 8 layers (digests, slope). carry: dist/prep dist/call22b.sh
O=$1; . dist/prep/bench/hosts/call_lib.sh
{
mk() { run make$1 60 python3 -c "import sys; sys.path.insert(0, '$P/bench/hosts'); from common import make_llama; make_llama('/tmp/llama7b-$1layers', layers=$1)"; }
mk 2; mk 4; mk 8
run hprec 60 python3 $P/bench/hessian_precision.py --library $P/python/qlink/lib/libqlink.so --markdown $R/hprec.md
cd $P/bench/hosts
codes=/tmp/qlink_codes; mkdir -p $codes
q() { local n=$1 name=$2 lim=$3 prec=$4; shift 4; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $prec --switch-interval 1e-4 --out $R/$name.json "$@"; }
q 2 q2c 40 tensor --codes $codes/q2c.pt
q 8 q8c 50 tensor
q 4 q4c 45 tensor
q 4 b4 50 tensor --profile $R/b4_ops.txt --device-only
q 2 ieee2 45 ieee_fp32 --codes $codes/ieee2.pt
run alone2 70 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --codes $codes/alone2.pt --out $R/alone2.json
run codes_ieee_vs_alone 60 python3 compare_codes.py $R/alone2.json $codes/alone2.pt $R/ieee2.json $codes/ieee2.pt $R/codes_ieee_vs_alone.json
run codes_tensor_vs_ieee 60 python3 compare_codes.py $R/ieee2.json $codes/ieee2.pt $R/q2c.json $codes/q2c.pt $R/codes_tensor_vs_ieee.json
run codes_tensor_vs_alone 60 python3 compare_codes.py $R/alone2.json $codes/alone2.pt $R/q2c.json $codes/q2c.pt $R/codes_tensor_vs_alone.json
q 4 i4 50 tensor --profile $R/i4_ops.txt --idle $R/i4_idle.txt
q 8 q8d 50 tensor
q 2 q2d 40 tensor
q 4 q4d 45 tensor
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
