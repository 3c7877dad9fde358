#!/bin/bash
# On the accelerator machine, from the repository root with dist/ (tools/dist.sh) in it:
# the GPU tests, then the benchmarks and the baselines (bench/baselines), in one run. Everything but the markdown tables
# goes to OUTDIR/log.txt. Usage: bash tools/device_run.sh OUTDIR [parts]
#   parts: test conf stress over raw copy plain coll nccl probe quant (default: all)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off
out=$1
parts=${2:-"test conf stress over raw copy plain coll nccl probe quant"}
mkdir -p "$out"
log=$out/log.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } >> "$log"
lib=dist/libqlink.so
for p in $parts; do
  echo "=== $p" >> "$log"
  case $p in
    test)  # the whole output kept, every failure named in the log
      timeout 400 python3 -m pytest -q -rf tests/python --qlink-library $lib -p no:cacheprovider > "$out/pytest.txt" 2>&1
      grep -E "^(FAILED|ERROR) |passed|failed" "$out/pytest.txt" | tail -n 30 >> "$log" ;;
    conf) dist/conformance_test --backend="$PWD/dist/libqlink_backend_cuda.so" 2>&1 | tail -3 >> "$log" ;;
    stress) TEST_SRCDIR="$PWD/dist/rf" dist/stress_test --config='{"backend": "cuda"}' 2>&1 | tail -3 >> "$log" ;;
    over) dist/abi_overhead $lib >> "$log" 2>&1 ;;
    raw) nvcc -O3 -std=c++20 -arch=sm_90 -o /tmp/p2p bench/baselines/p2p_bench.cu && /tmp/p2p >> "$log" 2>&1 ;;
    copy|plain)
      [ -f /tmp/raw_pull.so ] || nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC -o /tmp/raw_pull.so bench/raw_pull.cu >> "$log" 2>&1
      flag=""; [ $p = plain ] && flag=--plain-python
      timeout 300 python3 bench/copy_bench.py --library $lib --raw-pull /tmp/raw_pull.so $flag \
        --markdown "$out/$p.md" >> "$log" 2>&1 ;;
    coll) timeout 300 python3 bench/collectives_bench.py --library $lib --markdown "$out/collectives.md" >> "$log" 2>&1 ;;
    nccl) (cd bench/baselines && timeout 200 python3 nccl_bench.py) >> "$log" 2>&1 ;;
    probe) dist/qlink probe --bytes 268435456 >> "$log" 2>&1 ;;
    quant) timeout 300 python3 bench/quant_bench.py --library $lib --markdown "$out/quant.md" >> "$log" 2>&1 ;;
    *) echo "unknown part $p" >> "$log" ;;
  esac
done
cat "$log"
