#!/bin/bash
# On the accelerator machine, from a folder laid out by prepare.sh: every host run of
# bench/RESULTS.md, each in its own process, logs and JSON under OUTDIR.
#   bash bench/hosts/run_all.sh OUTDIR [PARTS]   PARTS: any of "pytest plan stress gptq ar ar0
#   gptq3 hprec loop loop_slope loop_host8 moe_check moe_solve moe moe_samples ar_stacks" (default the first
#   seven, in that order, the most wanted figures first where a lease is short). Issue 23's
#   figures: "hprec loop loop_slope", about 10 minutes (loop_host8, GPTQModel alone at 8
#   layers, about 3 more). Issue 22's: "ar ar0", about 8 (ar_stacks: where its fills come
#   from). Issue 20's: "moe_check moe_solve moe" (not yet run: first moe_check, whose output
#   says whether the stand-in and the checkpoint suit GPTQModel).
set -uo pipefail
cd "$(dirname "$0")"
out=$1
parts=${2:-"pytest plan stress gptq ar ar0 gptq3"}
model=/tmp/llama7b-2layers
codes=/tmp/qlink_codes  # the runs' 4-bit levels (hundreds of MB): compared here, not carried back
mkdir -p "$codes"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=../../python
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpus.txt"
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  local start=$(date +%s.%N)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
  tail -n 4 "$out/$name.log"
}
for part in $parts; do
  case $part in
    pytest)
      run pytest 200 python3 -m pytest -q -rf -p no:cacheprovider ../../tests/python --qlink-library ../../python/qlink/lib/libqlink.so ;;
    plan)
      run plan 60 python3 -m qlink plan --parallel auto --iters 200 --batch-size 8 --config '{"backend": "cuda"}'
      run plan2 60 python3 -m qlink plan --parallel 2 --iters 200 --batch-size 8 --config '{"backend": "cuda"}' ;;
    stress)
      for p in 1 2 3; do run stress$p 120 python3 stress_moves.py; done ;;
    gptq)  # GPTQModel alone, then with qlink (strict) GPTQ_QLINK_RUNS times (default 2)
      run gptq_host 300 python3 gptqmodel_run.py --model $model --out "$out/gptq_host.json"
      for r in $(seq 1 "${GPTQ_QLINK_RUNS:-2}"); do
        run gptq_qlink$r 300 python3 gptqmodel_run.py --model $model --qlink --strict --out "$out/gptq_qlink$r.json"
      done ;;
    gptq3)  # one more run with qlink: its tensors against the runs above
      run gptq_qlink3 300 python3 gptqmodel_run.py --model $model --qlink --strict --out "$out/gptq_qlink3.json" ;;
    hprec)  # the Hessian precision table: qlink and PyTorch, IEEE and tensor cores, vs float64
      run hprec 240 python3 ../hessian_precision.py --library ../../python/qlink/lib/libqlink.so \
        --json "$out/hprec.json" --markdown "$out/hprec.md" ;;
    loop)  # GPTQModel's loop alone at 2/4 layers, with qlink ieee_fp32 and tensor at 2 (their
      # levels kept), the levels compared: tensor vs ieee_fp32 vs GPTQModel alone
      run loop_host2 300 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 \
        --codes "$codes/host2.pt" --out "$out/loop_host2.json"
      run loop_host4 300 python3 gptqmodel_run.py --model /tmp/llama7b-4layers --layers 4 --out "$out/loop_host4.json"
      run loop_qlink2 200 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink --strict \
        --precision ieee_fp32 --codes "$codes/qlink2.pt" --out "$out/loop_qlink2.json"
      run loop_qlink2_tensor 200 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink \
        --strict --precision tensor --codes "$codes/qlink2_tensor.pt" --out "$out/loop_qlink2_tensor.json"
      run codes_ieee_vs_host 60 python3 compare_codes.py "$out/loop_host2.json" "$codes/host2.pt" \
        "$out/loop_qlink2.json" "$codes/qlink2.pt" "$out/codes_ieee_vs_host.json"
      run codes_tensor_vs_ieee 60 python3 compare_codes.py "$out/loop_qlink2.json" "$codes/qlink2.pt" \
        "$out/loop_qlink2_tensor.json" "$codes/qlink2_tensor.pt" "$out/codes_tensor_vs_ieee.json" ;;
    loop_slope)  # with qlink: two more ieee_fp32 runs at 2 layers (the main thread sampled in
      # one, torch.profiler over the other: GPU busy; the profiler changes no result), both
      # precisions at 4 and 8 layers
      run loop_qlink2_run2 200 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink \
        --strict --precision ieee_fp32 --samples-out "$out/loop_qlink2_samples.txt" --out "$out/loop_qlink2_run2.json"
      run loop_qlink2_profile 200 python3 gptqmodel_run.py --model /tmp/llama7b-2layers --layers 2 --qlink \
        --strict --precision ieee_fp32 --profile "$out/loop_qlink2_ops.txt" --out "$out/loop_qlink2_profile.json"
      for n in 4 8; do
        for p in ieee_fp32 tensor; do
          run loop_qlink${n}_$p 200 python3 gptqmodel_run.py --model /tmp/llama7b-${n}layers --layers $n --qlink \
            --strict --precision $p --out "$out/loop_qlink${n}_$p.json"
        done
      done ;;
    loop_host8)
      run loop_host8 420 python3 gptqmodel_run.py --model /tmp/llama7b-8layers --layers 8 --out "$out/loop_host8.json" ;;
    ar)  # issue 22: each a warm-up run, a timed run and (qlink's; AutoRound's with AR_HOST_PROFILE=1)
      # a profiled run in one process (about 5 minutes)
      run ar_qlink 240 python3 autoround_run.py --model $model --iters 200 --qlink auto --profile "$out/ar_qlink_ops.txt" \
        --out "$out/ar_qlink.json"
      run ar_host 330 python3 autoround_run.py --model $model --iters 200 ${AR_HOST_PROFILE:+--profile "$out/ar_host_ops.txt"} \
        --out "$out/ar_host.json" ;;
    moe_check)  # issue 20: the defuser stand-in against transformers' Qwen3-MoE, the checkpoint's keys
      run moe_check 300 python3 check_defuser.py --model /tmp/qwen3moe-2layers ;;
    moe_solve)  # issue 20: one layer's routed Hessians and 384 expert solves, qlink vs GPTQModel's own
      run moe_solve 400 python3 ../moe_solve_bench.py --library ../../python/qlink/lib/libqlink.so \
        --gptqmodel ../../hosts:standins --check-alone 24 --markdown "$out/moe_solve.md" ;;
    moe)  # issue 20: GPTQModel's loop on the Qwen3-MoE model with qlink at 2 and 4 layers (and 2
      # with GPTQModel's batches kept: what grouping gives), then GPTQModel alone until the first
      # solve of its layer 1 (about 300 s a layer: the first solves' times give one layer's; 4
      # layers alone take about 1,170 s, more than one call)
      for n in 2 4; do
        run moe_qlink$n 240 python3 gptqmodel_run.py --model /tmp/qwen3moe-${n}layers --layers $n \
          --model-kind qwen3_moe --qlink --strict --out "$out/moe_qlink$n.json"
      done
      run moe_qlink2_ungrouped 240 python3 gptqmodel_run.py --model /tmp/qwen3moe-2layers --layers 2 \
        --model-kind qwen3_moe --qlink --strict --group-rows 0 --out "$out/moe_qlink2_ungrouped.json"
      run moe_host2 420 python3 gptqmodel_run.py --model /tmp/qwen3moe-2layers --layers 2 \
        --model-kind qwen3_moe --stop-at-layer 1 --out "$out/moe_host2.json"
      grep -H "first solve" "$out"/moe_*.log ;;
    moe_samples)  # issue 20: where the routed loop's time goes, 2 layers with qlink, every thread
      # sampled (the sampling stretches the run; its times are not the loop's)
      run moe_samples 300 python3 gptqmodel_run.py --model /tmp/qwen3moe-2layers --layers 2 \
        --model-kind qwen3_moe --qlink --strict --samples-out "$out/moe_samples.txt" --out "$out/moe_samples.json" ;;
    ar_stacks)  # issue 22: qlink's run profiled with the Python stack behind each operator (the
      # iteration's fills of unknown origin; the stacks slow the profiled run, not the timed one)
      run ar_stacks 300 python3 autoround_run.py --model $model --iters 200 --qlink auto \
        --profile "$out/ar_qlink_stacks.txt" --profile-stacks --out "$out/ar_stacks.json" ;;
    ar0)  # a warm-up run and a timed one each (about 2 minutes)
      run ar0_host 150 python3 autoround_run.py --model $model --iters 0 --out "$out/ar0_host.json"
      run ar0_qlink 150 python3 autoround_run.py --model $model --iters 0 --qlink auto --out "$out/ar0_qlink.json" ;;
  esac
done
python3 summarize.py "$out" | tee "$out/summary.md"
