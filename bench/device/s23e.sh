#!/usr/bin/env bash
# Session 23 (issue 12), prepared: the MoE layer's A/B at batch 1, 4, 16
# (2 rounds, interleaved): ce71302 (.carry/old.tar.xz); the new build with
# M3_ROW_SCALED_X=0 (the E2M1 tile layout alone); the new build (layout
# and row-scaled x); with SwiGLU in the gate + up epilogue
# (M3_FUSE_SWIGLU=1); with that and the MoE combine in the next RMSNorm
# (M3_FOLD_COMBINE=1). The bench model's b4 / b16 routes move with the
# layout (compare layer GB/s there, bench/NOTES.md session 19 run 5).
set -u
. bench/device/common.sh
m3_setup old
m3_ab 2 "--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1 --batch 1,4,16" \
  /tmp/old/m3 "env M3_ROW_SCALED_X=0 /tmp/bin/m3" /tmp/bin/m3 "env M3_FUSE_SWIGLU=1 /tmp/bin/m3" \
  "env M3_FUSE_SWIGLU=1 M3_FOLD_COMBINE=1 /tmp/bin/m3" > $OUT/layer.log 2>&1
cat $OUT/layer.log
