#!/usr/bin/env bash
# Session 36 (issue 13), any card, ~150 s. The mono op profile with its
# new wake split (mono.cu / mono_prelude.h: when each CTA's body passed its
# dependency wait; mono.rs `wake_times`): for the CTA that finished each op
# last, how long after the op before ended it saw the barrier complete
# (wake) and how long its share then ran (run), and the mean wake over
# the CTAs that ran a body. Session 35's b1 profile had the small ops at
# ~9-12 us each of the critical path (RMSNorm of one row 9.1, head norm
# 9.5, the merge 11.1): barrier propagation or body? The default build,
# m3.1 --layers 12, 4k, b1 / b4 / b16 -> prof-b{1,4,16}.log.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# compile m3.1's kernels first (a cold cache)
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 4 --batch 1,4,16 --iters 1 --rounds 1 \
  --warmup 1 --parity-steps 0 --path both > $OUT/compile.log 2>&1 || tail -5 $OUT/compile.log
for b in 1 4 16; do
  echo "=== b$b ($(date +%T))"
  timeout 90 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 \
    --warmup 0 --batch $b --path mono --profile > $OUT/prof-b$b.log 2>&1
  grep -A20 "^mono ops" $OUT/prof-b$b.log | cut -c1-190
done
