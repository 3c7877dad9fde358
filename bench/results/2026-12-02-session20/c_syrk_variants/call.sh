#!/bin/bash
# Session 20: variants of the promoted Hessian kernel, timed on the loop's shape, compared bitwise with the library's.
O=$1; mkdir -p $O; cd dist/syrk
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $O/smi.txt 2>&1
(./syrk_bench || { nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o syrk_bench2 syrk_bench.cu -lcublas && ./syrk_bench2; }) > $O/bench.txt 2>&1
cat $O/bench.txt
cuobjdump -sass syrk_bench > $O/sass.txt 2>&1; ls -la $O/sass.txt
timeout 150 ncu --clock-control none -k regex:'v01K|Li2ELi4ELi32ELi3ELb0|Li2ELi2ELi32ELi3ELb0' --launch-skip 200 --launch-count 3 --section SpeedOfLight --section WarpStateStats --section Occupancy --section ComputeWorkloadAnalysis --section LaunchStats ./syrk_bench 'd32 s3' > $O/ncu.txt 2>&1; echo ncu rc=$?; tail -5 $O/ncu.txt
gzip -f $O/sass.txt
