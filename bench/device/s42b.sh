#!/usr/bin/env bash
# Session 42 (issue 12), the H200 wanted (~90 s cold): the one-row plain
# walk in a launch long enough that its ramp and tail stop mattering
# (1 x [131072, 6144]: 428 MB MXFP4, ~110 us) beside the figure of
# record's 1 x [49152, 6144] (~46 us), MXFP4, NVFP4, MXFP8, one row.
# Session 42 run 1: the MXFP4 walk reads 76% of the ceiling in the tall
# launch and 85% in a 111-us grouped launch, of a 91% own rate (L2-fed);
# this says how much of that is the plain launch's length.
# Writes tall-*.log / tall-*.json (no name another script here writes).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for s in 1x131072 1x49152; do
  echo "=== $s ($(date +%T))"
  timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack $s \
    --kernel-experts "" --kernel-rows 1 --kernel-formats mxfp4,nvfp4,mxfp8 --out $OUT/tall-$s.json > $OUT/tall-$s.log 2>&1
  echo "exit $?"; grep -E "x/row|rror|^ceiling" $OUT/tall-$s.log | cut -c1-150
done
