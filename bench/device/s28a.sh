#!/usr/bin/env bash
# Session 28, on an H200 (issues 12, 13). Each part into its own $OUT log,
# most telling first.
# 0. check.log: the runner's mono tests under REQUIRE_GPU=1 (the one-row
#    and one-tile linears are now mono ops of their own).
# 1. m1.log: the kernel microbench, tall 1 x [49152, 6144] and experts 4
#    and 16 of 128, at 1 and 16 rows (the 16-row experts are the other
#    bar), one launch a replay against 10 back to back (--kernel-reps);
#    the build against the one-row walk's batch doubled at fewer CTAs an
#    SM (session 26 run 3 measured the doubled batch only at the 6-CTA
#    bound, where it spills) and 4 CTAs an SM alone.
# 2. mono.log: `m3 bench --path both` at batch 1-64 (32 and 64: the wide
#    mode), the H200 table of issue 13; mono-u0.log: the same at 1-16 with
#    the mono build's full unroll (S_UNROLL_HALF=0: the one-row and
#    one-tile bodies have the registers for it).
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== test runner mono, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 150 /tmp/bin/test-runner mono_path auto_path wide_mono --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|bitwise|FAIL|crossover" | tail -16
} > $OUT/check.log 2>&1
cat $OUT/check.log
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$B S_R1_MINB_FP4=4;$B S_H_ONE_UMUL=2 S_R1_MINB_FP4=4 S_R1_MINB_FP8=3;$B S_H_ONE_UMUL=2 S_R1_MINB=3"
for r in 10 1; do
  echo "=== reps $r ($(date +%T))"
  timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4,16 \
    --kernel-rows 1,16 --kernel-reps $r --kernel-formats mxfp4,nvfp4,mxfp8 --variants "$V" 2>&1 | grep -E "^\||rror|^ceiling"
done > $OUT/m1.log 2>&1
grep -E "x/row|===|rror" $OUT/m1.log
timeout 130 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
  --batch 1,4,16,32,64 --context 4096 --iters 40 --rounds 2 --path both > $OUT/mono.log 2>&1
echo "exit $?" >> $OUT/mono.log
grep -E "^\| decode|^crossover|per layer|^mono path|^exit" $OUT/mono.log | tail -24
M3_MONO_DEFINES="S_UNROLL_HALF=0" timeout 90 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
  --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both > $OUT/mono-u0.log 2>&1
echo "exit $?" >> $OUT/mono-u0.log
grep -E "^\| decode|^crossover|per layer|^mono path|^exit" $OUT/mono-u0.log | tail -16
