#!/usr/bin/env bash
# Prepared in session 45 (issue 12), any card, ~350 s cold: MXFP8's
# one-row and one-tile entry points at 5 and 6 CTAs an SM instead of 4
# (S_R1_MINB_FP8 / S_R8_MINB_FP8; NVRTC 13.0: 122 registers and no spill
# at 4, 96 and 24 bytes at 5, 80 and 24-32 bytes at 6). Session 12 chose 4
# on older walks (before session 19's coalesced FP8 layout and session
# 26's per-block one-row walk); session 45's MXFP4 routed entry gained
# 4.6-5.2% a layer from one more CTA an SM. The microbench's E4M3 tall
# launch and 8 x 6144 stack at 1 / 4 / 8 rows (fp8-*.log), then the MoE
# layer at b1 / b2 / b4 / b8, 2 rounds interleaved (fp8-layer.log;
# LAYER=0 leaves it out).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
for st in 1x49152 8x6144; do
  m3_kernels "fp8-$st" 240 --kernel-stack $st --kernel-rows 1,4,8 --kernel-experts "" --kernel-formats mxfp8 \
    --variants "$D S_R1_MINB_FP8=5 S_R8_MINB_FP8=5;$D S_R1_MINB_FP8=6 S_R8_MINB_FP8=6"
done
[ "${LAYER:-1}" = 1 ] || exit 0
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,2,4,8 --context 4096 --iters 40 --rounds 1 --path standard"
m3_defines_ab 2 "$B" base= "fp8m5=$D S_R1_MINB_FP8=5 S_R8_MINB_FP8=5" \
  "fp8m6=$D S_R1_MINB_FP8=6 S_R8_MINB_FP8=6" > "$OUT/fp8-layer.log" 2>&1
cut -c1-150 "$OUT/fp8-layer.log"
