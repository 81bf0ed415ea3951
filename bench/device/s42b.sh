#!/usr/bin/env bash
# Session 42 (issue 12), the H200 wanted (~150 s cold), one row:
# 1. the plain walk in a launch long enough that its ramp and tail stop
#    mattering (1 x [131072, 6144]: 428 MB MXFP4, ~110 us) beside the
#    figure of record's 1 x [49152, 6144] (~46 us), MXFP4, NVFP4, MXFP8
#    (tall-*.log). Session 42 run 1: the MXFP4 walk reads 76% of the
#    ceiling in the tall launch and 85% in a 111-us grouped launch, of a
#    91% own rate (L2-fed): how much of that is the plain launch's length;
# 2. S_E2M1_HI_FMA=1 (half 1's right shift as IMAD.HI on the FMA pipe:
#    the MXFP4 loop's ALU-pipe instructions 178 -> 162, all 283 -> 288,
#    NVRTC 13.0) against the defaults, tall, grouped memory-fed and
#    L2-fed, MXFP4 and NVFP4 (hi.log): does the walk's own rate, ALU-pipe
#    bound there (session 42 run 5), move with one ALU instruction of
#    eleven a code word taken off?
# Writes names no other script here writes.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
for s in 1x131072 1x49152; do
  echo "=== $s ($(date +%T))"
  timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack $s \
    --kernel-experts "" --kernel-rows 1 --kernel-formats mxfp4,nvfp4,mxfp8 --out "$OUT/tall-$s.json" > "$OUT/tall-$s.log" 2>&1
  echo "exit $?"; grep -E "x/row|rror|^ceiling" "$OUT/tall-$s.log" | cut -c1-150
done
echo "=== hi ($(date +%T))"
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x49152 \
  --kernel-rows 1 --kernel-experts 64 --kernel-top-k 64 --kernel-expert-n 1024 --kernel-l2 \
  --kernel-formats mxfp4,nvfp4 --variants "$D S_E2M1_HI_FMA=1" --out "$OUT/hi.json" > "$OUT/hi.log" 2>&1
echo "exit $?"; grep -E "x/row|rror|^ceiling" "$OUT/hi.log" | cut -c1-170
