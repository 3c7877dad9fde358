#!/bin/bash
# What every device call's script (bench/results/*/call.sh) starts from, sourced from the repository's root on the
# accelerator machine with O set to the call's output folder: the laid-out package in P (dist/prep, from
# prepare.sh), the raw outputs' folder R, the environment (NVLink multicast off), and
#   run NAME LIMIT COMMAND...
# which runs COMMAND with its output in $R/NAME.log for at most LIMIT seconds, never past the call's DEADLINE
# (BUDGET seconds after sourcing, 540 by default), and prints its exit status, its time and its log's last lines.
P=$PWD/dist/prep
R=$O/r
mkdir -p "$R"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$P/python QLINK_HOSTS_ROOT=$P
DEADLINE=$(($(date +%s) + ${BUDGET:-540}))
run() {
  local name=$1 lim=$2 left start
  shift 2
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 10 ]; then
    echo "=== $name skipped"
    return
  fi
  [ "$lim" -gt "$left" ] && lim=$left
  echo "=== $name"
  start=$(date +%s.%N)
  timeout "$lim" "$@" > "$R/$name.log" 2>&1
  echo "rc=$? $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
  tail -n 3 "$R/$name.log"
}
