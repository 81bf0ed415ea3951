#!/usr/bin/env bash
# Session 28, on an H200 (issues 12, 13). Each part into its own $OUT log.
# 1. m1.log: the kernel microbench, tall 1 x [49152, 6144] and experts 4
#    and 16 of 128, at 1 and 16 rows (the 16-row experts are the other
#    bar), one launch a replay against 10 back to back (--kernel-reps);
#    the build against the one-row walk's batch doubled at fewer CTAs an
#    SM (session 26 run 3 measured the doubled batch only at the 6-CTA
#    bound, where it spills) and 4 CTAs an SM alone.
# 2. check.log: the runner's mono tests under REQUIRE_GPU=1 (issue 13: the
#    one-row and one-tile linears are mono ops of their own now; the
#    microbench has compiled the standard builds, the mono build is left:
#    150 s was too little on the H100 with a cold cache).
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$B S_R1_MINB_FP4=4;$B S_H_ONE_UMUL=2 S_R1_MINB_FP4=4 S_R1_MINB_FP8=3;$B S_H_ONE_UMUL=2 S_R1_MINB=3"
for r in 10 1; do
  echo "=== reps $r ($(date +%T))"
  timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4,16 \
    --kernel-rows 1,16 --kernel-reps $r --kernel-formats mxfp4,nvfp4,mxfp8 --variants "$V" 2>&1 | grep -E "^\||rror|^ceiling"
done > $OUT/m1.log 2>&1
grep -E "x/row|===|rror" $OUT/m1.log
{
  echo "=== test runner mono, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 220 /tmp/bin/test-runner mono_path auto_path wide_mono --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|bitwise|FAIL|crossover" | tail -16
} > $OUT/check.log 2>&1
cat $OUT/check.log
