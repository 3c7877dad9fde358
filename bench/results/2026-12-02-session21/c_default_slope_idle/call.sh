#!/bin/bash
# Session 21, call c (its own lease). dist/prep: main 3c9b193. GPTQModel's loop with qlink on the default precision
# (ieee_fp32) at 2 / 8 / 4 layers twice (the default's slope beside call a/b's tensor one), then the 4-layer tensor
# loop profiled with the GPU's idle time by the host's stacks (call b's timed out at 50 s).
# carry: dist/prep dist/call22c.sh
O=$1; . dist/prep/bench/hosts/call_lib.sh
{
mk() { run make$1 60 python3 -c "import sys; sys.path.insert(0, '$P/bench/hosts'); from common import make_llama; make_llama('/tmp/llama7b-$1layers', layers=$1)"; }
mk 2; mk 4; mk 8
cd $P/bench/hosts
q() { local n=$1 name=$2 lim=$3 prec=$4; shift 4; run $name $lim python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink --strict --precision $prec --switch-interval 1e-4 --out $R/$name.json "$@"; }
q 2 e2a 45 ieee_fp32
q 8 e8a 70 ieee_fp32
q 4 e4a 55 ieee_fp32
q 2 e2b 45 ieee_fp32
q 8 e8b 70 ieee_fp32
q 4 e4b 55 ieee_fp32
q 4 i4 90 tensor --profile $R/i4_ops.txt --idle $R/i4_idle.txt
} > $R/run.txt 2>&1
cat $R/run.txt
cd $O && tar czf r.tgz r && rm -rf r
