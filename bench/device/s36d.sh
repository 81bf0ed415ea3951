#!/usr/bin/env bash
# Session 36 (issue 13), any card, ~300 s. `M3_MONO_ROTATE_LATE=1`
# (PathOptions::mono_rotate_late, untimed): each mono op's blocks start
# past the CTAs that held the op before's last round, so a small op after
# a large one runs on CTAs already waiting at the barrier. s36a.sh's wake
# split (H100, b1, session 36's defaults before LIN 63 / ATTN 2 / ACQ 1):
# the head norm's critical CTA passed its wait 5.2 us after q|k|v's last
# finish and the index scores' 6.7 us (their CTAs are the ones that ran
# the op before's last round), where CTAs already waiting took ~1.5 us.
# The same bits. Interleaved with the default (base), 2 rounds, b1 / b4 /
# b16, each after a 16-step gate -> ab.log; then b1 / b16 profiles of both
# -> prof-{base,rot}-b{1,16}.log (look at `wake` for the head norm, index
# scores and top-k).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_env_ab M3_MONO_ROTATE_LATE 2 "$B" base= rot=1 > $OUT/ab.log 2>&1
grep -E "^===|compiled|\[mono\]|\[auto\]|differ|rror|failed" $OUT/ab.log | cut -c1-150
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --path mono --profile"
for vb in base:1 rot:1 base:16 rot:16; do
  v=${vb%%:*} b=${vb#*:}
  variant $v timeout 60 /tmp/bin/m3 bench $P --batch $b > $OUT/prof-$v-b$b.log 2>&1
  echo "=== profile $v b$b (exit $?)"; grep -A20 "^mono ops" $OUT/prof-$v-b$b.log | cut -c1-190
done
