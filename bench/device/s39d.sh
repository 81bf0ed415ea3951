#!/usr/bin/env bash
# Session 39 (issue 12), any card (an H200 wanted), ~150 s cold: the
# kernel microbench's plain case in four shapes in one call, MX formats,
# 1 and 16 rows, one launch a case a replay (the decode build: 16 features
# a CTA, 4 CTAs an SM, 528 slots on 132 SMs) -> SHAPE.log:
#   tall   1 x [49152, 6144]  3072 CTAs (session 32's figure of record)
#   s6144  8 x [6144, 6144]    384 CTAs a launch (the default shape)
#   s8448  8 x [8448, 6144]    528 CTAs a launch: one full wave
#   s12288 8 x [12288, 6144]   768 CTAs a launch: 1.45 waves
# tall against s8448 is what 7 launch boundaries cost; s6144 and s12288
# against s8448 what a partial wave costs (bench/NOTES.md session 39).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
K="--backend gpu --preset m3.1 --kernels --kernel-experts 4 --kernel-rows 1,16 --kernel-reps 1 --kernel-formats mxfp4,nvfp4,mxfp8"
for shape in tall:1x49152 s6144:8x6144 s8448:8x8448 s12288:8x12288; do
  echo "=== ${shape%%:*} ($(date +%T))"
  # shellcheck disable=SC2086
  timeout 120 /tmp/bin/m3 bench $K --kernel-stack ${shape#*:} > $OUT/${shape%%:*}.log 2>&1
  echo "exit $?"
  grep -E "x/row|rror|^ceiling" $OUT/${shape%%:*}.log | grep -v experts | cut -c1-150
done
