#!/bin/bash
# The accelerator machine's one runner, from a folder laid out by tools/pack.sh (its
# tools/device.sh is this script): each named part runs its commands one after another, each
# in its own process under a time limit, its output in OUTDIR/NAME.log; what the runner says
# goes to OUTDIR/run.txt (and stdout). At the end OUTDIR is packed into OUTDIR.tar.xz (beside
# it, members under OUTDIR's name; the same files give the same bytes): the run's archive, to
# be committed as bench/results/<run>.tar.xz.
#   bash tools/device.sh OUTDIR PART...     bash tools/device.sh --list
# Parts (a group's name stands for its parts):
#   GPU tests and benchmarks (group gpu, all of them):
#     pytest     the Python tests, their GPU half included (the first 30 FAILED/ERROR lines in run.txt);
#                TESTS: only these files of tests/python
#     conf       conformance_test against the CUDA backend
#     stress     stress_test on the CUDA backend
#     over       abi_overhead: a prepared plan through the ABI, C++
#     raw        bench/baselines/p2p_bench.cu built with nvcc and run (raw CUDA copy paths)
#     copy plain copy_bench.py (plain: --plain-python), raw_pull.cu built with nvcc
#     coll       collectives_bench.py           nccl  bench/baselines/nccl_bench.py
#     probe      qlink probe --bytes 268435456  quant quant_bench.py
#     solve_bits solve_bits.py: the engine's solve against GPTQModel's, bytes by shape, with a diagonal tie
#                (again with ALT_LIB's libraries where it is set)
#   Host runs, GPTQModel's and AutoRound's (group hosts: pytest plan stress_moves gptq ar ar0 gptq3):
#     models     the LLaMA models at 7B dimensions, /tmp/llama7b-<N>layers for N in LAYERS
#     moe_models the Qwen3-MoE models, /tmp/qwen3moe-<N>layers for N in MOE_LAYERS
#     plan       qlink plan, --parallel auto and 2
#     stress_moves  stress_moves.py, STRESS_RUNS times
#     gptq       GPTQModel alone, then with qlink (strict) GPTQ_QLINK_RUNS times; gptq3 one more
#     isolated   GPTQModel alone on the 2-layer 7B model, then qlink (as alone's arithmetic: ieee_fp32, Cholesky
#                inverse, no TF32) on GPTQModel's own add_batch, merge and batches: where they part (compare_runs.py)
#     hprec      hessian_precision.py: qlink and PyTorch, IEEE and tensor cores, vs float64
#     kernel_ab  hessian_precision.py's qlink tensor row with this pack's libraries and ALT_LIB's (a
#                folder of another build's): each Hessian kernel's time and the digest of its bytes; the
#                parts after it run ALT_LIB's libraries unless this pack's were faster with the same bytes
#     loop       GPTQModel's loop alone at 2/4 layers, qlink ieee_fp32 and tensor at 2 (GPTQModel's solve),
#                levels compared
#     loop_slope qlink ieee_fp32 at 2 layers sampled and profiled, PRECISIONS at SLOPE_LAYERS
#     loop_host8 GPTQModel alone at 8 layers
#     ar ar0 ar_stacks  AutoRound alone and with qlink at AR_ITERS (ar0: iters 0; ar_stacks: profiled)
#     ar_moe_host ar_moe_qlink ar_moe_grouped  AutoRound on the 2-layer Qwen3-MoE model (moe_models first):
#                alone with the gc freeze; with qlink but grouped_moe off; with qlink's defaults (grouped_moe on);
#                at AR_MOE_ITERS (50), then 0
#     ar0_moe    iters 0 alone: AutoRound alone with the gc freeze, then qlink's defaults (AR_MOE_CPROFILE:
#                then profiled)
#     ar_moe_save  the user's whole flow at iters 0, quantize_and_save (each layer packed and written in
#                the block loop): alone with the gc freeze, then qlink's defaults (grouped_moe)
#     moe_check moe_solve moe moe_samples  the Qwen3-MoE runs (issue 20)
#     archs      arch_table.py: GPTQModel alone and qlink strict on each architecture's small model
#     archs_ref  arch_table.py --references on REF_ARCHS (qwen3,mixtral; alone reversed, alone in float64)
#     trained    trained_model.py: the model trained on corpus/ and its quantizations' perplexity
#                (TRAINED_VARIANTS: some of its variants, comma-separated; TRAINED_PARALLEL: its
#                quantizations at once, 4)
#     attn       attention_determinism.py: each SDPA backend's bytes over 12 fresh processes
#     walks      finalize_walks.py: GPTQModel's per-module walks of the model at 2, 48, 94 MoE layers, qlink's lookups
#     unwrap     check_unwrap.py: AutoRound's own unwrap of 128 experts one by one against qlink's stacked
#                unwrap (bit for bit, and the time of each), RTN and a tuned block's end
#     worlds     the GPTQ engine's worlds test on this machine's CPU (bin/, blas.tar.xz's OpenBLAS), on
#                the kernels it picks and on its Haswell, SkylakeX and Cooperlake ones
#   The speed set, on SHAPES ("2 4 32 70b": 7B-shaped models of so many layers, 70b a LLaMA-70B-shaped
#   layer, 70bN N of them), each part after speed_models in the same lease:
#     packer     GPTQModel's C++ packer built (so no timed run builds it; before any alone run)
#     speed_models  the models of SHAPES
#     warmup     qlink's defaults once on the first shape, not compared: a fresh machine's first CUDA process
#                pays its kernels' loading (5.31 s against 3.82-4.57 s later at 2 layers, thirty-first session)
#     speed      qlink's defaults on each shape, then GPTQModel alone on each but 32 layers (a short budget
#                then cuts alone's long runs, not qlink's)
#     defaults   qlink's defaults (install(strict=True), no other argument) on each shape
#     alone      GPTQModel alone on each shape but 32 layers (speed is defaults, then alone)
#     no_warmup  the defaults on each shape with layer 0's landing page-locked at the landing, not in the capture
#     groups     the defaults on each shape with GROUP_ROWS (32768) tokens a grouped forward
#     inverse_bench  gptq_inverse_bench.py: the engine's two inverses on 7B and 70B layers, and how
#                far each route's codes are from float64 GPTQ's (engine and PyTorch)
#     inverse    the defaults with GPTQModel's inverse and IEEE fp32 cross-block updates (the defaults
#                before the thirty-first session)
#     triangular the defaults with IEEE fp32 cross-block updates (the triangular inverse alone)
#     gemm       the defaults with tensor_gemm Hessians
#     speed_profile  the defaults on each shape profiled (torch.profiler's operators, the GPU's idle time by
#                host stack) and, in another run, its main thread sampled
#     attention  the defaults with each forward saving left out (--attention-outputs off, which takes
#                the tails too; --stopped-products off; --tail-inputs off): the time each buys, the
#                defaults' digests expected
#     divergence DIV_RUNS (15) qlink ieee_fp32 runs (the divergence's likelier precision) of DIV_LAYERS (4: where
#                it has been seen; the models part makes them) with layer 0's o_proj inputs and each call of its
#                attention (arguments, weights) digested, and the placed calibration cache checked at the end
#                (--cache-check), compared by compare_runs.py (where a divergent run parts)
#     sanitize   one ieee_fp32 run of the 1-layer model (16 samples, to the MLP's first solve) under
#                compute-sanitizer memcheck with PyTorch's caching allocator off: a stray or freed-memory write
#                named (issue 40's divergence: a persistent change to o_proj's first group); after models
#                with LAYERS=1
#     moe_stage  the Qwen3-MoE models at MOE_LAYERS with the expert stage (install's default)
#     moe_bare   the same without the bench's digests (its checksum work beside the loop left out)
#     moe_no_offload  moe_bare with GPTQModel's per-module disk offload left out (what the finalizers' offload costs)
#     moe_workers  moe_bare with GPTQModel's CPU pool (its finalizers) at 2 threads (install(cpu_workers=2))
#     moe_switch  moe_bare with the loop's switch interval at 1e-4 s
#     moe_tensor  moe_bare with the Hessians on qlink's kernel (--precision tensor; the defaults take the vendor's GEMM)
#     moe_groups moe_bare with GROUP_ROWS (32768) tokens a grouped forward (install's: 16384), half the forwards
#     moe_stage_samples  moe_bare at 2 layers, every thread sampled
#     moe_nostage  qlink's defaults but expert_stage=False at 2
#     moe_host   GPTQModel alone to layer 1's first solve, then the stage as GPTQModel solves (ieee_fp32, its
#                inverse, IEEE updates): layer 0's codes compared
#     moe_spread GPTQModel alone so again with its samples reversed, its codes against moe_host's (after it)
#     moe_ungrouped  the stage as moe_host's but on GPTQModel's own batches (no grouped forwards): layer 0's
#                codes against moe_host's (after it)
#     moe_isolated  the stage as moe_ungrouped's but on GPTQModel's own Hessian arithmetic (--host-hessians: its
#                add_batch and merge, its per-batch products under the stage): layer 0's codes against
#                moe_host's (after it), what the stage's forwards and the solves change
#     moe_alone_inputs  moe_isolated's stage with layer 0's attention solved by GPTQModel (--host-solves) and
#                its experts' linears run one at a time (--grouped-experts off, the loop's bits): its solves
#                on alone's weights and Hessians, layer 0's codes against moe_host's (after it),
#                and each solve's inputs, output and Hessian traits (compare_runs.py)
#     gar_ties   whether GPTQModel's group-aware order (torch.topk on the GPU) breaks diagonal ties in column
#                order, as qlink's engine does (gar_ties.py)
#     moe_parting GPTQModel alone to layer 0's first expert solve and the stage (ieee_fp32, on GPTQModel's
#                batches) so, layer 0's attention calls and o_proj's add_batch inputs digested, batch by
#                batch: where they part (compare_runs.py)
#     moe_expert_inputs  GPTQModel alone to layer 0's first down_proj solve and moe_isolated's stage so, each
#                solve's weight, merged Hessian and output digested, experts 0-7's rows forward by forward,
#                the MLP's norm and router calls: whether each expert's Hessian is alone's (then its codes
#                part in the solve) or not, and then whether its rows or the block's input part first
#     moe_expert_solves  moe_expert_inputs's runs, the stage's attention solved by GPTQModel (--host-solves): each
#                expert solve of qlink's engine on alone's weight and Hessian, its output against alone's
#     moe_235b   a Qwen3-235B-A22B-shaped 2-layer model through the stage (made first)
#     moe_dsv3   a DeepSeek-V3-shaped 1-layer model through the stage (made first)
#   On a machine of several GPUs (group gpus, LAYERS=2 MOE_LAYERS=2; dsv3_gpus after moe_dsv3, in a call of its own):
#     dense_gpus GPTQModel's loop on the 2-layer 7B model on every GPU, alone and with qlink; qlink on one
#     moe_gpus   the 2-layer Qwen3-MoE model through the stage on one GPU, then on every GPU
#     dsv3_gpus  the DeepSeek-V3-shaped layer through the stage on one GPU, then on every GPU
#     moe_tree   Qwen3-30B-A3B's module tree with small matrices: GPTQModel alone and qlink's defaults to layer 2 at 2
#                and 48 layers (the per-module costs as the model grows), then qlink's whole 48-layer run
#     breakdown  GPTQModel alone with each of qlink's process settings (gc, switch, segments, workers: its CPU
#                pool at 2 threads) and all four (BD_SETTINGS) at 2 and 4 layers (BD_LAYERS)
#     ar_breakdown  AutoRound with qlink, then alone with no setting, all three of those and each, a timed run
#                apiece after one warm-up in one process (AR_ITERS)
#   Groups: gpu, hosts, issue20 (moe_check moe_solve moe), issue22 (ar ar0), issue23 (hprec loop loop_slope),
#   ar_moe (ar_moe_host ar_moe_qlink ar_moe_grouped), issue40 (packer speed_models warmup speed inverse gemm
#   attention)
# Environment: BUDGET (seconds for the whole run, 540 by default, 0 for none: a command's
# limit is cut to what is left, and one with less than 10 s left is skipped, so the archive is
# always made), DRY_RUN=1 (say each command, run none), KEEP_RAW=0 (remove OUTDIR once packed),
# ARCH (nvcc's -arch, sm_90), BUILD_DIR (nvcc's outputs, /tmp/qlink_device), MODEL
# (/tmp/llama7b-2layers), SHAPES (the speed set's), CODES (the loops' 4-bit levels, hundreds of MB, kept out of OUTDIR:
# /tmp/qlink_codes), LAYERS ("2 4 8"), DIV_RUNS (15), DIV_LAYERS (4), DIV_PARALLEL (1), DIV_CALLS (1; 0: no call digests), DIV_WARM (set: an SDPA before each run's loop), DIV_MERGE_EACH (set: every task merges its own Hessian, --merge-each), MOE_LAYERS ("2 4"),
# GROUP_ROWS (32768), SLOPE_LAYERS ("4 8"), REF_ARCHS (archs_ref's, "qwen3,mixtral"),
# PRECISIONS ("ieee_fp32 tensor"), STRESS_RUNS (3), GPTQ_QLINK_RUNS (2), AR_ITERS (200), AR_MOE_ITERS (50), AR_HOST_PROFILE
# (set: AutoRound alone profiled too), AR_MOE_CPROFILE (set: ar_moe_grouped and ar0_moe add an iters=0 run under cProfile). NVLink multicast stays off (NCCL, symmetric memory,
# NVSHMEM). Exits 0 when every command exited 0, 1 naming those that did not, 2 on a bad part.
set -uo pipefail
P=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit "${1:-2}"
}

declare -A groups=(
  [gpu]="pytest conf stress over raw copy plain coll nccl probe quant"
  [hosts]="pytest plan stress_moves gptq ar ar0 gptq3"
  [issue20]="moe_check moe_solve moe"
  [issue22]="ar ar0"
  [issue23]="hprec loop loop_slope"
  [ar_moe]="ar_moe_host ar_moe_qlink ar_moe_grouped"
  [issue40]="packer speed_models warmup speed inverse gemm attention"
  [gpus]="models moe_models dense_gpus moe_gpus"
)

lib=$P/python/qlink/lib/libqlink.so
# The engine solving as GPTQModel does (install's defaults are the triangular inverse and TF32 updates),
# and with its Hessians too: the runs whose codes or losses are held against GPTQModel alone's
host_solve=(--inverse cholesky_inverse --tf32 off)
as_host=(--precision ieee_fp32 "${host_solve[@]}")
build=${BUILD_DIR:-/tmp/qlink_device}
arch=${ARCH:-sm_90}
model=${MODEL:-/tmp/llama7b-2layers}
codes=${CODES:-/tmp/qlink_codes}
hosts_dir=$P/bench/hosts
cwd=$hosts_dir   # where run() starts a command: a part that runs elsewhere says so (local cwd=...)
failed=()

# run NAME LIMIT COMMAND...: COMMAND in $cwd, its output in $out/NAME.log, for at most LIMIT
# seconds and never past the deadline; says its exit status, its time and its log's last lines.
run() {
  local name=$1 limit=$2 left start rc
  shift 2
  if [ "$deadline" -gt 0 ]; then
    left=$((deadline - $(date +%s)))
    if [ "$left" -lt 10 ]; then
      echo "=== $name skipped: the budget is spent"
      failed+=("$name(skipped)")
      return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
  fi
  echo "=== $name (at most $limit s): $*"
  if [ -n "${DRY_RUN:-}" ]; then
    local arg
    for arg in "$@"; do  # a script named relative to where the command starts is there
      if [[ "$arg" == *.py && "$arg" != /* && ! -f "$cwd/$arg" ]]; then
        echo "=== $name: no $arg in $cwd"
        failed+=("$name")
      fi
    done
    return
  fi
  start=$(date +%s%N)
  (cd "$cwd" && exec timeout "$limit" "$@") >"$out/$name.log" 2>&1
  rc=$?
  echo "=== $name rc=$rc $(awk "BEGIN {printf \"%.1f\", ($(date +%s%N) - $start) / 1e9}") s"
  tail -n 4 "$out/$name.log"
  [ $rc -eq 0 ] || failed+=("$name")
}

nvcc_once() {  # NAME OUTPUT NVCC_ARGS...: builds OUTPUT unless it is there
  local name=$1 output=$2
  shift 2
  [ -f "$output" ] && [ -z "${DRY_RUN:-}" ] && return
  mkdir -p "$build"
  run "$name" 300 nvcc -O3 -arch="$arch" -o "$output" "$@"
}

# The GPU tests and benchmarks.
part_pytest() {
  local files=() f
  local cwd=$P  # not bench/hosts: its scripts would be importable as the tests' modules
  for f in ${TESTS:-.}; do files+=("$P/tests/python/$f"); done
  run pytest 400 python3 -m pytest -q -rf -p no:cacheprovider "${files[@]}" --qlink-library "$lib"
  [ -f "$out/pytest.log" ] && grep -E "^(FAILED|ERROR) " "$out/pytest.log" | head -n 30  # the counts: run's tail
}
part_conf() { run conf 300 "$P/bin/conformance_test" --backend="$P/python/qlink/lib/libqlink_backend_cuda.so"; }
part_stress() { run stress 300 env TEST_SRCDIR="$P/rf" "$P/bin/stress_test" --config='{"backend": "cuda"}'; }
part_over() { run over 120 "$P/bin/abi_overhead" "$lib"; }
part_raw() {
  nvcc_once raw_build "$build/p2p_bench" -std=c++20 "$P/bench/baselines/p2p_bench.cu"
  run raw 300 "$build/p2p_bench"
}
copy_bench() {  # NAME [FLAG]
  nvcc_once raw_pull_build "$build/raw_pull.so" -shared -Xcompiler -fPIC "$P/bench/raw_pull.cu"
  run "$1" 300 python3 "$P/bench/copy_bench.py" --library "$lib" --raw-pull "$build/raw_pull.so" ${2:+"$2"} \
    --markdown "$out/$1.md"
}
part_copy() { copy_bench copy; }
part_plain() { copy_bench plain --plain-python; }
part_coll() { run coll 300 python3 "$P/bench/collectives_bench.py" --library "$lib" --markdown "$out/collectives.md"; }
part_nccl() {
  local cwd=$P/bench/baselines
  run nccl 200 python3 nccl_bench.py
}
part_probe() { run probe 120 "$P/python/qlink/lib/qlink" probe --bytes 268435456; }
part_solve_bits() {  # the engine's solve against GPTQModel's by a Qwen3-MoE layer's shapes, with a diagonal tie;
  # again on ALT_LIB's libraries where it names a folder of another build's
  run solve_bits 300 python3 "$P/bench/solve_bits.py" --library "$lib" --gptqmodel "$P/hosts:$hosts_dir/standins" \
    --out "$out/solve_bits.json"
  [ -n "${ALT_LIB:-}" ] || return 0
  run solve_bits_alt 300 python3 "$P/bench/solve_bits.py" --library "$(cd "$ALT_LIB" && pwd)/libqlink.so" \
    --gptqmodel "$P/hosts:$hosts_dir/standins" --out "$out/solve_bits_alt.json"
}
part_quant() { run quant 300 python3 "$P/bench/quant_bench.py" --library "$lib" --markdown "$out/quant.md"; }

# The host runs (bench/hosts): GPTQModel's and AutoRound's trees from hosts/, the stand-ins.
part_models() {  # each model made in a process of its own, before the runs that time it
  local n
  for n in ${LAYERS:-2 4 8}; do
    run make_llama$n 300 python3 -c "import sys; sys.path.insert(0, '$hosts_dir'); from common import make_llama; \
make_llama('/tmp/llama7b-${n}layers', layers=$n)"
  done
}
part_moe_models() {
  local n
  for n in ${MOE_LAYERS:-2 4}; do
    run make_qwen3moe$n 300 python3 -c "import sys; sys.path.insert(0, '$hosts_dir'); \
from common import make_qwen3_moe; make_qwen3_moe('/tmp/qwen3moe-${n}layers', layers=$n)"
  done
}
part_plan() {
  run plan 60 python3 -m qlink plan --parallel auto --iters 200 --batch-size 8 --config '{"backend": "cuda"}'
  run plan2 60 python3 -m qlink plan --parallel 2 --iters 200 --batch-size 8 --config '{"backend": "cuda"}'
}
part_stress_moves() {
  local r
  for r in $(seq 1 "${STRESS_RUNS:-3}"); do run stress_moves$r 120 python3 stress_moves.py; done
}
gptqmodel_run() {  # NAME LIMIT ARGS...: gptqmodel_run.py, its JSON in $out/NAME.json
  local name=$1 limit=$2
  shift 2
  run "$name" "$limit" python3 gptqmodel_run.py "$@" --out "$out/$name.json"
}
part_gptq() {  # GPTQModel alone, then with qlink (strict) GPTQ_QLINK_RUNS times
  local r
  gptqmodel_run gptq_host 300 --model "$model"
  for r in $(seq 1 "${GPTQ_QLINK_RUNS:-2}"); do gptqmodel_run gptq_qlink$r 300 --model "$model" --qlink --strict; done
}
part_isolated() {  # alone, then qlink on alone's own Hessians (add_batch, merge, batches): one digest if all else is alone's
  gptqmodel_run iso_host 300 --model "$model" --input-digests
  gptqmodel_run iso_qlink 300 --model "$model" --qlink --strict "${as_host[@]}" --group-rows 0 --host-hessians \
    --input-digests
  run iso_compare 60 python3 compare_runs.py "$out/iso_host.json" "$out/iso_qlink.json" --out "$out/isolated.json"
}
part_gptq3() { gptqmodel_run gptq_qlink3 300 --model "$model" --qlink --strict; }  # its tensors against gptq's
# The Hessian kernel of this pack against ALT_LIB's, timed and its bytes compared: this pack's kept where it is
# faster at every width with the same bytes, else ALT_LIB's libraries copied over this pack's for the parts after it.
part_kernel_ab() {
  local alt=${ALT_LIB:?kernel_ab needs ALT_LIB, the folder of another build and its libraries}
  alt=$(cd "$alt" && pwd) || return
  run kernel_ab_pack 120 python3 "$P/bench/hessian_precision.py" --library "$lib" --dims 11008,28672 \
    --variant "qlink tensor, 128 calls" --json "$out/kernel_pack.json"
  run kernel_ab_alt 120 python3 "$P/bench/hessian_precision.py" --library "$alt/libqlink.so" --dims 11008,28672 \
    --variant "qlink tensor, 128 calls" --json "$out/kernel_alt.json"
  [ -n "${DRY_RUN:-}" ] && return
  if python3 - "$out/kernel_pack.json" "$out/kernel_alt.json" <<'EOF'
import json, sys
pack, alt = (json.load(open(path))["rows"] for path in sys.argv[1:3])
for x, y in zip(pack, alt):
    print("d=%s: this pack %s ms, ALT_LIB %s ms, digests %s" % (
        x["d"], x.get("ms"), y.get("ms"), "equal" if x.get("digest") == y.get("digest") else "differ"))
sys.exit(0 if len(pack) == len(alt) > 0 and all(x["digest"] == y["digest"] and x["ms"] < y["ms"]
                                                for x, y in zip(pack, alt)) else 1)
EOF
  then
    echo "=== kernel_ab: this pack's kernel kept"
  else
    cp -f "$alt"/*.so "$P/python/qlink/lib/" && echo "=== kernel_ab: ALT_LIB's libraries copied over this pack's"
  fi
}
part_hprec() {
  run hprec 240 python3 ../hessian_precision.py --library "$lib" --json "$out/hprec.json" --markdown "$out/hprec.md"
}
part_loop() {  # the levels kept in $codes and compared: tensor vs ieee_fp32 vs GPTQModel alone
  mkdir -p "$codes"
  gptqmodel_run loop_host2 300 --model /tmp/llama7b-2layers --layers 2 --codes "$codes/host2.pt"
  gptqmodel_run loop_host4 300 --model /tmp/llama7b-4layers --layers 4
  gptqmodel_run loop_qlink2 200 --model /tmp/llama7b-2layers --layers 2 --qlink --strict "${as_host[@]}" \
    --codes "$codes/qlink2.pt"
  gptqmodel_run loop_qlink2_tensor 200 --model /tmp/llama7b-2layers --layers 2 --qlink --strict --precision tensor \
    "${host_solve[@]}" --codes "$codes/qlink2_tensor.pt"
  run codes_ieee_vs_host 60 python3 compare_codes.py "$out/loop_host2.json" "$codes/host2.pt" \
    "$out/loop_qlink2.json" "$codes/qlink2.pt" "$out/codes_ieee_vs_host.json"
  run codes_tensor_vs_ieee 60 python3 compare_codes.py "$out/loop_qlink2.json" "$codes/qlink2.pt" \
    "$out/loop_qlink2_tensor.json" "$codes/qlink2_tensor.pt" "$out/codes_tensor_vs_ieee.json"
}
part_loop_slope() {  # the main thread sampled in one run, torch.profiler over another (GPU busy)
  local n p
  gptqmodel_run loop_qlink2_run2 200 --model /tmp/llama7b-2layers --layers 2 --qlink --strict --precision ieee_fp32 \
    --samples-out "$out/loop_qlink2_samples.txt"
  gptqmodel_run loop_qlink2_profile 200 --model /tmp/llama7b-2layers --layers 2 --qlink --strict \
    --precision ieee_fp32 --profile "$out/loop_qlink2_ops.txt"
  for n in ${SLOPE_LAYERS:-4 8}; do
    for p in ${PRECISIONS:-ieee_fp32 tensor}; do
      gptqmodel_run loop_qlink${n}_$p 200 --model /tmp/llama7b-${n}layers --layers "$n" --qlink --strict --precision "$p"
    done
  done
}
part_loop_host8() { gptqmodel_run loop_host8 420 --model /tmp/llama7b-8layers --layers 8; }
autoround_run() {  # NAME LIMIT ARGS...: autoround_run.py, its JSON in $out/NAME.json
  local name=$1 limit=$2
  shift 2
  run "$name" "$limit" python3 autoround_run.py --model "$model" "$@" --out "$out/$name.json"
}
part_ar() {  # each a warm-up run, a timed run and a profiled one (AutoRound's with AR_HOST_PROFILE)
  autoround_run ar_qlink 240 --iters "${AR_ITERS:-200}" --qlink auto --profile "$out/ar_qlink_ops.txt"
  autoround_run ar_host 330 --iters "${AR_ITERS:-200}" ${AR_HOST_PROFILE:+--profile "$out/ar_host_ops.txt"}
}
part_ar0() {
  autoround_run ar0_host 150 --iters 0
  autoround_run ar0_qlink 150 --iters 0 --qlink auto
}
part_ar_stacks() {  # the Python stack behind each operator of qlink's profiled run
  autoround_run ar_stacks 300 --iters "${AR_ITERS:-200}" --qlink auto --profile "$out/ar_qlink_stacks.txt" \
    --profile-stacks
}
part_ar_moe_host() {  # issue 42: AutoRound alone (gc freeze) on the 2-layer Qwen3-MoE model, then iters 0
  local model=/tmp/qwen3moe-2layers
  autoround_run ar_moe_host 420 --iters "${AR_MOE_ITERS:-50}" --settings gc
  autoround_run ar0_moe_host 200 --iters 0 --settings gc
}
part_ar_moe_qlink() {  # the same with qlink, its experts AutoRound's loop (grouped_moe off), then iters 0
  local model=/tmp/qwen3moe-2layers
  autoround_run ar_moe_qlink 420 --iters "${AR_MOE_ITERS:-50}" --qlink auto --grouped-moe off
  autoround_run ar0_moe_qlink 200 --iters 0 --qlink auto --grouped-moe off
}
ar0_moe_grouped() {  # qlink's defaults at iters 0 on the caller's model
  autoround_run ar0_moe_grouped 200 --iters 0 --qlink auto
  if [ -n "${AR_MOE_CPROFILE:-}" ]; then  # where the iters=0 run's time still goes (its timing not comparable)
    autoround_run ar0_moe_grouped_cprofile 200 --iters 0 --qlink auto --cprofile "$out/ar0_moe_grouped_cprofile.txt"
  fi
}
part_ar_moe_grouped() {  # the same with qlink's defaults (grouped_moe)
  local model=/tmp/qwen3moe-2layers
  autoround_run ar_moe_grouped 420 --iters "${AR_MOE_ITERS:-50}" --qlink auto
  ar0_moe_grouped
}
part_ar0_moe() {  # iters 0 only: AutoRound alone (gc freeze), then qlink's defaults
  local model=/tmp/qwen3moe-2layers
  autoround_run ar0_moe_host 200 --iters 0 --settings gc
  ar0_moe_grouped
}
part_ar_moe_save() {
  local model=/tmp/qwen3moe-2layers
  autoround_run ar0_moe_save_host 240 --iters 0 --settings gc --save /tmp/ar_saved_host
  autoround_run ar0_moe_save_grouped 240 --iters 0 --qlink auto --save /tmp/ar_saved_qlink
}
part_moe_check() { run moe_check 300 python3 check_defuser.py --model /tmp/qwen3moe-2layers; }
part_moe_solve() {  # one layer's routed Hessians and 384 expert solves, qlink vs GPTQModel's own
  run moe_solve 400 python3 ../moe_solve_bench.py --library "$lib" --gptqmodel "$P/hosts:$hosts_dir/standins" --check-alone 24 \
    --markdown "$out/moe_solve.md"
}
part_moe() {  # qlink at MOE_LAYERS (and 2 with GPTQModel's batches kept), GPTQModel alone to layer 1's first solve
  local n
  for n in ${MOE_LAYERS:-2 4}; do
    gptqmodel_run moe_qlink$n 240 --model /tmp/qwen3moe-${n}layers --layers "$n" --model-kind qwen3_moe --qlink --strict
  done
  gptqmodel_run moe_qlink2_ungrouped 240 --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --qlink \
    --strict --group-rows 0
  gptqmodel_run moe_host2 420 --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --stop-at-layer 1
  [ -n "${DRY_RUN:-}" ] || grep -H "first solve" "$out"/moe_*.log
}
part_archs() {
  run archs 540 python3 arch_table.py --dir /tmp/arch_models --samples 64 --seqlen 512 --out "$out/arch_table.json"
}
part_trained() {  # issue 40: corpus/ is tools/pack.sh's (python3.11-doc's sources, corpus.py's split)
  run trained 480 python3 trained_model.py --corpus "$P/corpus" --dir /tmp/trained --out "$out/trained.json" \
    --parallel "${TRAINED_PARALLEL:-4}" ${TRAINED_VARIANTS:+--variants "$TRAINED_VARIANTS"}
}
part_archs_ref() {
  run archs_ref 540 python3 arch_table.py --dir /tmp/arch_models --archs "${REF_ARCHS:-qwen3,mixtral}" --samples 64 \
    --seqlen 512 --references --out "$out/arch_ref.json"
}
part_attn() { run attn 200 python3 "$P/bench/attention_determinism.py" --processes 12; }
part_walks() { run walks 120 python3 "$P/bench/finalize_walks.py" --hosts "$P/hosts:$hosts_dir/standins"; }
part_unwrap() {
  run unwrap 120 python3 check_unwrap.py
}
part_worlds() {  # on OpenBLAS's kernels for this processor, then on its Haswell, SkylakeX, Cooperlake ones
  local blas=$build/blas core
  mkdir -p "$blas" && tar -xJf "$P/blas.tar.xz" -C "$blas"
  run cpu 10 lscpu
  for core in "" Haswell SkylakeX Cooperlake; do
    run worlds${core:+_$core} 240 env TEST_SRCDIR="$P/rf" LD_LIBRARY_PATH="$blas/openblas-pthread:$blas" \
      OPENBLAS_VERBOSE=2 ${core:+OPENBLAS_CORETYPE=$core} "$P/bin/gptq_engine_test" --gtest_filter='Gptq.*Worlds*'
  done
}
# on_shape NAME LIMIT SHAPE ARGS...: gptqmodel_run on a speed model: SHAPE N (N 7B-shaped layers), 70b (one
# LLaMA-70B-shaped layer) or 70bN (N of them)
on_shape() {
  local name=$1 limit=$2 shape=$3 n
  shift 3
  if [[ "$shape" == 70b* ]]; then
    n=${shape#70b}
    gptqmodel_run "$name" "$limit" --model "/tmp/llama$shape" --layers "${n:-1}" --model-kind llama70b "$@"
  else
    gptqmodel_run "$name" "$limit" --model "/tmp/llama7b-${shape}layers" --layers "$shape" "$@"
  fi
}
shapes=${SHAPES:-2 4 32 70b}
part_packer() {
  run packer 240 python3 -c "import common; common.setup_paths(); from gptqmodel.utils.cpp import \
load_pack_block_extension as load; assert load() is not None"
}
part_speed_models() {
  local s
  for s in $shapes; do
    if [[ "$s" == 70b* ]]; then
      run make_llama$s 300 python3 -c "import sys; sys.path.insert(0, '$hosts_dir'); from common import make_llama, \
LLAMA_70B; make_llama('/tmp/llama$s', layers=int('${s#70b}' or 1), **LLAMA_70B)"
    else
      LAYERS=$s part_models
    fi
  done
}
part_warmup() { local s=${shapes%% *}; on_shape warmup$s 300 "$s" --qlink --strict --defaults; }
part_speed() { part_defaults; part_alone; }  # a short budget then cuts alone's long runs, not qlink's
part_alone() { local s; for s in $shapes; do [ "$s" = 32 ] || on_shape speed_host$s 300 "$s"; done; }
qlink_on_shapes() {  # PREFIX ARGS...: qlink (strict) with ARGS on each shape, PREFIX<shape>
  local prefix=$1 s
  shift
  for s in $shapes; do on_shape $prefix$s 300 "$s" --qlink --strict "$@"; done
}
part_defaults() { qlink_on_shapes speed_qlink --defaults; }
# layer 0's landing page-locking its own blocks (no warm-up in the capture)
part_no_warmup() { qlink_on_shapes no_warmup --defaults --pinned-warmup off; }
part_speed_profile() {
  local s
  for s in $shapes; do
    on_shape profile$s 300 "$s" --qlink --strict --defaults --profile "$out/profile${s}_ops.txt" \
      --idle "$out/profile${s}_idle.txt"
    on_shape samples$s 300 "$s" --qlink --strict --defaults --samples-out "$out/samples${s}.txt"
  done
}
part_inverse_bench() {
  run inverse_bench 180 python3 "$P/bench/gptq_inverse_bench.py" --library "$lib" --markdown "$out/inverse.md"
}
part_inverse() { qlink_on_shapes inv_chain --defaults "${host_solve[@]}"; }  # GPTQModel's inverse, IEEE fp32 updates
part_triangular() { qlink_on_shapes inv_tri --defaults --tf32 off; }  # the defaults with IEEE fp32 updates
part_gemm() { qlink_on_shapes inv_gemm_ --precision tensor_gemm; }  # install's defaults, tensor_gemm Hessians
part_attention() {  # each forward saving left out (install keeps them all); defaults' digests expected
  local s saving
  for s in $shapes; do
    for saving in attention-outputs stopped-products tail-inputs; do
      on_shape ${saving%%-*}_off$s 300 "$s" --qlink --strict --defaults --$saving off
    done
  done
}
part_divergence() {  # DIV_PARALLEL runs at a time share the GPU: less device time, more timing spread
  local r n=${DIV_LAYERS:-4} width=${DIV_PARALLEL:-1} mib cap
  # A run of one 7B-shaped layer peaks near 17 GiB of PyTorch's and more of the process's: at most
  # one run per 24 GiB of the GPU (four on an 80 GB H100 ran 10 of 24 out of memory, session 37).
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  cap=$((${mib:-0} / 24576 > 0 ? ${mib:-0} / 24576 : 1))
  if [ -n "$mib" ] && [ "$width" -gt "$cap" ]; then
    width=$cap
    echo "divergence: $width runs at a time on a GPU of $mib MiB"
  fi
  local extra=(--call-digests 'layers\.0\.self_attn$')  # DIV_CALLS=0: without them (they change the timing)
  [ "${DIV_CALLS:-1}" = 0 ] && extra=()
  [ -n "${DIV_WARM:-}" ] && extra+=(--warm-attention)  # the attention's first run before the loop's
  [ -n "${DIV_MERGE_EACH:-}" ] && extra+=(--merge-each)  # the concurrent merges' race, every time
  for r in $(seq 1 "${DIV_RUNS:-15}"); do
    gptqmodel_run div$r 120 --model /tmp/llama7b-${n}layers --layers "$n" --qlink --strict "${as_host[@]}" \
      --input-digests --batch-digests 'layers\.0\.self_attn\.o_proj$' --cache-check "${extra[@]}" &
    [ $((r % width)) -eq 0 ] && wait
  done
  wait
  # A run in the background keeps its failure to itself: one that wrote no JSON failed.
  for r in $(seq 1 "${DIV_RUNS:-15}"); do
    [ -n "${DRY_RUN:-}" ] || [ -f "$out/div$r.json" ] || failed+=("div$r")
  done
  run div_compare 60 python3 compare_runs.py "$out"/div[0-9]*.json --out "$out/o_proj_runs.json"
}
part_sanitize() {  # a short divergence run under compute-sanitizer memcheck, each tensor its own cudaMalloc
  local cs pad=()
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # A padding buffer after each allocation, where this version has one: a write past one tensor's end into the next
  # allocation is otherwise a valid address to memcheck.
  "$cs" --help 2>/dev/null | grep -q -- '--padding' && pad=(--padding 4096)
  run sanitize 540 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$cs" --tool memcheck --leak-check no --print-limit 20 "${pad[@]}" \
    python3 gptqmodel_run.py --model /tmp/llama7b-1layers --layers 1 --qlink --strict "${as_host[@]}" --samples 16 \
    --stop-at-module 'layers\.0\.mlp\.' --input-digests --batch-digests 'layers\.0\.self_attn\.o_proj$' \
    --cache-check --out "$out/sanitize.json"
}
stage_runs() {  # PREFIX ARGS...: the Qwen3-MoE models at MOE_LAYERS through the expert stage, PREFIX<layers>
  local prefix=$1 n
  shift
  for n in ${MOE_LAYERS:-2 4}; do
    gptqmodel_run $prefix$n 240 --model /tmp/qwen3moe-${n}layers --layers "$n" --model-kind qwen3_moe --qlink \
      --strict --expert-stage on "$@"
  done
}
part_moe_stage() { stage_runs moe_stage --defaults; }
part_moe_bare() { stage_runs moe_bare --defaults --no-digests; }  # without the bench's checksums beside the loop
# moe_bare but for one thing each: GPTQModel's per-module offload left out; its CPU pool (the finalizers, 8
# threads on 16 cores) at 2; the loop's switch interval 1e-4 s
part_moe_no_offload() { stage_runs moe_no_offload --defaults --no-digests --module-offload off; }
part_moe_workers() { stage_runs moe_workers --defaults --no-digests --cpu-workers 2; }
part_moe_switch() { stage_runs moe_switch --no-digests --switch-interval 1e-4; }
part_moe_tensor() { stage_runs moe_tensor --no-digests --precision tensor; }  # qlink's kernel's Hessians
part_moe_groups() { stage_runs moe_groups --defaults --no-digests --group-rows "${GROUP_ROWS:-32768}"; }
part_groups() { qlink_on_shapes groups --defaults --group-rows "${GROUP_ROWS:-32768}"; }  # GROUP_ROWS a grouped forward
part_moe_stage_samples() {
  gptqmodel_run moe_stage2_samples 240 --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --qlink \
    --strict --defaults --expert-stage on --no-digests --samples-out "$out/moe_stage2_samples.txt"
}
part_moe_nostage() {
  gptqmodel_run moe_nostage2 240 --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --qlink --strict \
    --defaults --expert-stage off
}
moe_against_host() {  # NAME COMPARISON LIMIT ARGS...: the 2-layer Qwen3-MoE model so, its layer 0 against moe_host's
  local name=$1 comparison=$2 limit=$3
  shift 3
  gptqmodel_run "$name" "$limit" --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe "$@" \
    --codes "$codes/$name.pt"
  run "$comparison" 60 python3 compare_codes.py "$out/moe_host.json" "$codes/moe_host.pt" "$out/$name.json" \
    "$codes/$name.pt" "$out/$comparison.json"
}
part_moe_host() {  # GPTQModel alone to layer 1's first solve, then the stage (ieee_fp32): layer 0's codes compared
  mkdir -p "$codes"
  gptqmodel_run moe_host 420 --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --stop-at-layer 1 \
    --input-digests --codes "$codes/moe_host.pt"
  moe_against_host moe_stage_ieee moe_codes 240 --qlink --strict --expert-stage on "${as_host[@]}"
}
part_moe_spread() {  # GPTQModel alone with its samples reversed, against moe_host's alone: its own spread
  moe_against_host moe_host_reversed moe_codes_reversed 420 --stop-at-layer 1 --reversed
}
part_moe_ungrouped() {  # moe_stage_ieee on GPTQModel's batches, against moe_host's alone: what the grouping changes
  moe_against_host moe_stage_ieee_ungrouped moe_codes_ungrouped 240 --qlink --strict --expert-stage on "${as_host[@]}" \
    --group-rows 0
}
part_moe_isolated() {  # the stage on GPTQModel's Hessian arithmetic: what else differs, against moe_host's alone
  moe_against_host moe_stage_isolated moe_codes_isolated 240 --qlink --strict --expert-stage on "${as_host[@]}" \
    --group-rows 0 --host-hessians
}
part_moe_alone_inputs() {  # moe_isolated's stage, layer 0's attention solved by GPTQModel: the experts on alone's inputs
  moe_against_host moe_stage_alone_inputs moe_codes_alone_inputs 240 --qlink --strict --expert-stage on \
    "${as_host[@]}" --group-rows 0 --host-hessians --host-solves 'self_attn\.' --grouped-experts off --input-digests
  run moe_alone_inputs 60 python3 compare_runs.py "$out/moe_host.json" "$out/moe_stage_alone_inputs.json" \
    --out "$out/moe_alone_inputs.json"
}
part_gar_ties() { run gar_ties 60 python3 gar_ties.py --out "$out/gar_ties.json"; }  # GPTQModel's GAR order on ties
moe_parted() {  # NAME LIMIT ARGS...: GPTQModel alone (at most LIMIT s) and the stage solving as it does, on its
  # batches, with the caller's stage_only flags, both with ARGS; compare_runs.py says where they part
  local name=$1 limit=$2
  shift 2
  gptqmodel_run "${name}_host" "$limit" --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe "$@"
  gptqmodel_run "${name}_stage" 240 --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --qlink \
    --strict --expert-stage on "${as_host[@]}" --group-rows 0 "${stage_only[@]}" "$@"
  run "$name" 60 python3 compare_runs.py "$out/${name}_host.json" "$out/${name}_stage.json" --out "$out/$name.json"
}
part_moe_parting() {  # which input of layer 0's attention, or which parameter, first differs from alone's
  local stage_only=()
  moe_parted moe_parting 300 --stop-at-module 'layers\.0\.mlp\.experts\.' --input-digests \
    --batch-digests 'layers\.0\.self_attn\.o_proj$' --call-digests 'layers\.0\.self_attn$'
}
part_moe_expert_inputs() {  # each expert solve's inputs (weight, merged Hessian) and output against alone's
  local stage_only=(--host-hessians)
  moe_parted moe_expert_inputs 360 --stop-at-module 'layers\.0\.mlp\.experts\.[0-9]+\.down_proj$' --input-digests \
    --batch-digests 'layers\.0\.mlp\.experts\.[0-7]\.gate_proj$' \
    --call-digests 'layers\.0\.(post_attention_layernorm|mlp\.gate)$'
}
part_moe_expert_solves() {  # the engine's expert solves on alone's inputs: layer 0's attention solved by GPTQModel
  local stage_only=(--host-hessians --host-solves 'self_attn\.')
  moe_parted moe_expert_solves 360 --stop-at-module 'layers\.0\.mlp\.experts\.[0-9]+\.down_proj$' --input-digests \
    --call-digests 'layers\.0\.mlp\.gate$'
}
part_moe_235b() {  # issue 41: a Qwen3-235B-A22B-shaped pair of layers through the stage: a layer's time, the peak
  run make_qwen3_235b 300 python3 -c "import sys; sys.path.insert(0, '$hosts_dir'); from common import \
make_qwen3_moe, QWEN3_235B; make_qwen3_moe('/tmp/qwen3-235b-2layers', layers=2, **QWEN3_235B)"
  gptqmodel_run moe235_stage 420 --model /tmp/qwen3-235b-2layers --layers 2 --model-kind qwen3_235b --qlink \
    --strict --defaults --expert-stage on
}
part_moe_dsv3() {  # issue 41: a DeepSeek-V3-shaped layer (about 52 GB of gate/up Hessians) through the stage
  run make_deepseek_v3 400 python3 -c "import sys; sys.path.insert(0, '$hosts_dir'); from common import \
make_deepseek_v3; make_deepseek_v3('/tmp/deepseek-v3-1layer', layers=1)"
  gptqmodel_run dsv3_stage 500 --model /tmp/deepseek-v3-1layer --layers 1 --model-kind deepseek_v3 --qlink \
    --strict --defaults --expert-stage on
}
gptqmodel_on() {  # NAME LIMIT GPUS ARGS...: gptqmodel_run on GPUS ("one": GPU 0 alone; "every": all of them)
  local name=$1 limit=$2 visible=$3
  shift 3
  [ "$visible" = one ] && visible=0
  [ "$visible" = every ] && visible=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
  run "$name" "$limit" env CUDA_VISIBLE_DEVICES="$visible" python3 gptqmodel_run.py "$@" --out "$out/$name.json"
}
part_dense_gpus() {  # GPTQModel's loop on every GPU, never run before with qlink: the 2-layer 7B model alone
  # and with qlink's defaults on every GPU, then qlink on one (models or speed_models first)
  gptqmodel_on dense_gpus_host 300 every --model /tmp/llama7b-2layers --layers 2
  gptqmodel_on dense_gpus_qlink 300 every --model /tmp/llama7b-2layers --layers 2 --qlink --strict --defaults
  gptqmodel_on dense_gpus_qlink1 300 one --model /tmp/llama7b-2layers --layers 2 --qlink --strict --defaults
}
part_moe_gpus() {  # issue 41: the stage on one GPU, then on every GPU (its experts placed over them): the
  # 2-layer Qwen3-MoE model (moe_models first)
  local gpus
  for gpus in one every; do
    gptqmodel_on moe_gpus_$gpus 240 $gpus --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --qlink \
      --strict --defaults --expert-stage on
  done
}
part_dsv3_gpus() {  # issue 41: the DeepSeek-V3-shaped layer (moe_dsv3 first) on one GPU, then on every GPU
  local gpus
  for gpus in one every; do
    gptqmodel_on dsv3_gpus_$gpus 500 $gpus --model /tmp/deepseek-v3-1layer --layers 1 --model-kind deepseek_v3 \
      --qlink --strict --defaults --expert-stage on
  done
}
part_moe_tree() {  # issue 41: the loop's costs per module at a whole model's size (Qwen3-30B-A3B's module tree,
  # small matrices): GPTQModel alone and qlink's defaults to layer 2's first solve at 2 and at 48 layers, then
  # qlink's whole 48-layer run
  local n
  for n in 2 48; do
    gptqmodel_run tree${n}_host 300 --model /tmp/qwen3tree-${n}layers --layers $n --model-kind qwen3_moe_tree \
      --stop-at-layer 2
    gptqmodel_run tree${n}_qlink 300 --model /tmp/qwen3tree-${n}layers --layers $n --model-kind qwen3_moe_tree \
      --qlink --strict --defaults --stop-at-layer 2
  done
  gptqmodel_run tree48_qlink_whole 500 --model /tmp/qwen3tree-48layers --layers 48 --model-kind qwen3_moe_tree \
    --qlink --strict --defaults
}
part_breakdown() {
  local n s
  for n in ${BD_LAYERS:-2 4}; do
    for s in ${BD_SETTINGS:-gc switch segments workers gc,switch,segments,workers}; do
      gptqmodel_run bd_host${n}_${s//,/+} 300 --model /tmp/llama7b-${n}layers --layers $n --settings $s
    done
  done
}
part_ar_breakdown() {  # AutoRound with qlink, then alone: no setting, all of qlink's, each (one process, one warm-up)
  autoround_run bd_ar_qlink 330 --iters "${AR_ITERS:-200}" --qlink auto
  autoround_run bd_ar_host 480 --iters "${AR_ITERS:-200}" --settings "none;gc,switch,segments;gc;switch;segments"
}
part_moe_samples() {  # every thread sampled (the sampling stretches the run)
  gptqmodel_run moe_samples 300 --model /tmp/qwen3moe-2layers --layers 2 --model-kind qwen3_moe --qlink --strict \
    --samples-out "$out/moe_samples.txt"
}
[ $# -ge 1 ] || usage
case $1 in
  -h | --help) usage 0 ;;
  --list)
    declare -F | sed -n 's/^declare -f part_//p' | tr '\n' ' '
    echo
    for g in "${!groups[@]}"; do echo "$g: ${groups[$g]}"; done
    exit 0
    ;;
  -*) usage ;;
esac
out=$1
shift
[ $# -ge 1 ] || { echo "device.sh: name at least one part (--list)" >&2; exit 2; }
parts=()
for arg in "$@"; do
  for p in ${groups[$arg]:-$arg}; do
    if ! declare -F "part_$p" >/dev/null; then
      echo "device.sh: unknown part '$p' (--list names them)" >&2
      exit 2
    fi
    [[ " ${parts[*]} " == *" $p "* ]] || parts+=("$p")
  done
done
budget=${BUDGET:-540}
deadline=0
[ "$budget" -gt 0 ] && deadline=$(($(date +%s) + budget))
mkdir -p "$out" && out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P

main() {
  local p
  echo "=== device.sh ${parts[*]} into $out, budget ${budget} s, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  cat "$P/PACKED.txt" 2>/dev/null
  if [ -z "${DRY_RUN:-}" ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  fi
  for p in "${parts[@]}"; do
    echo "=== part $p"
    "part_$p"
  done
  if [ -z "${DRY_RUN:-}" ] && compgen -G "$out/*.json" >/dev/null; then
    python3 "$hosts_dir/summarize.py" "$out" >"$out/summary.md" 2>&1 && cat "$out/summary.md"
  fi
  if [ ${#failed[@]} -gt 0 ]; then
    echo "=== not passed: ${failed[*]}"
    return 1
  fi
  echo "=== every command exited 0"
}
main 2>&1 | tee "$out/run.txt"
rc=${PIPESTATUS[0]}
archive=$out.tar.xz
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cJf "$archive" -C "$(dirname "$out")" \
  "$(basename "$out")" && echo "=== archive $archive ($(du -k "$archive" | cut -f1) KiB)"
[ "${KEEP_RAW:-1}" = 0 ] && rm -rf "$out"
exit "$rc"
