#!/usr/bin/env bash
# Session 41 (issue 12), the H200 wanted (the H100 measured both, runs 1
# and 3), ~200 s cold: the two FP4 one-row ideas where the FP4 walks sit
# below the ceiling (H200: 75 / 71% at one row, session 32):
# 0. bench/proto/pipes.py again, each CTA's span now read behind a barrier;
# 1. /tmp/bin/m3 (landed decode): the defaults and S_W_PF_L1=20 (the next
#    batch's weights prefetched into L1, MXFP4 + NVFP4; with
#    S_W_PF_MODE=1 in launches of several segments, the gate + up pairs,
#    only), the tall launch
#    1 x [49152, 6144] and grouped experts 4 / 16, 1 and 16 rows, MXFP4,
#    NVFP4, MXFP8 (bin.log: also the H200's figures of record at one row);
# 2. /tmp/logic/m3: the E2M1 decode by bit operations alone
#    (bench/results/2026-12-07-s41/d/e2m1_logic.patch), the same cases
#    (logic.log);
# 3. LAYER=1: the MoE layer with the prefetch in the gate + up launches
#    only (layer.log, below).
set -u
. bench/device/common.sh
m3_setup logic
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if [ "${QUICK:-0}" != 1 ]; then
  echo "=== pipes ($(date +%T))"
  timeout 60 python3 bench/proto/pipes.py > $OUT/pipes.log 2>&1
  echo "exit $?"; cat $OUT/pipes.log
fi
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
K="--backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x49152 --kernel-experts 4,16 --kernel-rows 1,16 --kernel-formats mxfp4,nvfp4,mxfp8"
# QUICK=1 (~120 s cold): one row, 4 experts, no pipes
[ "${QUICK:-0}" = 1 ] && K="--backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x49152 --kernel-experts 4 --kernel-rows 1 --kernel-formats mxfp4,nvfp4,mxfp8"
echo "=== bin ($(date +%T))"
# shellcheck disable=SC2086
timeout 240 /tmp/bin/m3 bench $K --variants "$D S_W_PF_L1=20;$D S_W_PF_L1=20 S_W_PF_MODE=1" > $OUT/bin.log 2>&1
echo "exit $?"; grep -E "x/row|rror|^ceiling" $OUT/bin.log | cut -c1-150
echo "=== logic ($(date +%T))"
# shellcheck disable=SC2086
timeout 150 /tmp/logic/m3 bench $K > $OUT/logic.log 2>&1
echo "exit $?"; grep -E "x/row|rror|^ceiling" $OUT/logic.log | cut -c1-150
# LAYER=1 (~90 s warm): the MoE layer (m3.1 --layers 12 minus 6, b1 / b4 /
# b16, standard path) with the prefetch in the launches of several
# segments only (S_W_PF_MODE=1: the routed gate + up; the bench model's
# shared expert is MXFP8) against the defaults, interleaved, 2 rounds.
# Session 41's run 2 had it in every FP4 one-row launch, the routed down
# projections too: b1 2.7% slower on the H100, though the microbench's
# grouped gate + up gained 12 points.
[ "${LAYER:-0}" = 1 ] || exit 0
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path standard"
for r in 1 2; do
  for v in base pf; do
    echo "=== layer $v round $r ($(date +%T))"
    if [ $v = base ]; then
      # shellcheck disable=SC2086
      timeout 150 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| (\[[^]]*\] )?decode[^|]*\| [0-9.]+ / |rror"
    else
      # shellcheck disable=SC2086
      M3_SMALL_STEP_DEFINES="$D S_W_PF_L1=20 S_W_PF_MODE=1" timeout 150 /tmp/bin/m3 bench $B 2>&1 \
        | grep -E "^\| (\[[^]]*\] )?decode[^|]*\| [0-9.]+ / |rror"
    fi
  done
done > $OUT/layer.log 2>&1
cut -c1-150 $OUT/layer.log
