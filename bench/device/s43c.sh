#!/usr/bin/env bash
# Session 43 (issue 12), any card, ~90 s warm: the 16-row tile walk at 5
# CTAs an SM. Run 1 (Nsight Compute, H100) found the walk at 16 warps an
# SM with no unit saturated: `m3s_mma_fp4` (the small-step build's entry
# for 9-16 rows) takes 128 registers, 4 CTAs an SM. With S_MMA_MINB=5 it
# takes 96 with 64 bytes of spill (NVRTC 13.0; 1-3 local stores and loads a
# 16-row loop). The microbench's grouped gate + up at 16 rows over 4, 16
# and 64 of 128 experts (and L2-fed), MXFP4, small-step build against the
# same at 5 CTAs an SM (minb5.log): top-k 4 of [3072, 6144] experts gives
# 16 rows an expert at 4 experts (the 16-row walk), 4 and ~1 at 16 and
# 64, where the same entry point runs its one-tile and one-row walks at
# the same bound. The index lists S_MMA_MINB as negative, measured on
# older walks (sessions 2, 5, 12), never on this one.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "=== minb5 ($(date +%T))"
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x16 \
  --kernel-rows 16 --kernel-experts 4,16,64 --kernel-l2 --kernel-formats mxfp4 \
  --variants "S_MMA_WARPS=4 S_MMA_MAXBT=2 S_MMA_MINB=5" > "$OUT/minb5.log" 2>&1
echo "exit $?"; grep -E "experts.*x/row|rror|^ceiling" "$OUT/minb5.log" | cut -c1-190
