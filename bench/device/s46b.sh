#!/usr/bin/env bash
# Prepared in session 45 (issue 12), any card, ~400 s cold: FP4 routed
# launches of 2-8 rows on the `_r8s` entry points (`S_ROUTED_TILE=1`, a
# bench option): a slot of one row by the one-row walk, as the general
# entry runs it, where `_r8` (the default) runs every slot by the one-tile
# walk. At b4 most of a step's 16 pairs sit alone in their slot. MXFP4's
# `_r8s` gives `_r8`'s bits (simulator); NVFP4's gives the general entry's
# (its one-row walk sums apart from its tile walk) and runs at 4 CTAs an SM
# with no spill where `_r8` runs at 6 with 292 bytes (NVRTC 13.0). Session
# 44's first `_rs` form had both walks at 5 CTAs an SM for 2-16 rows and
# lost 3.2% a b4 layer (MXFP4). The grouped gate + up at 4 and 8 rows over
# 4 / 16 / 64 experts, L2-fed too (tile.log), then the MoE layer at b2 /
# b4 / b8 with MXFP4 and with NVFP4 experts, 2 rounds interleaved
# (tile-layer-*.log; LAYER=0 leaves them out).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
m3_kernels tile 300 --kernel-stack 1x16 --kernel-rows 4,8 --kernel-experts 4,16,64 --kernel-l2 \
  --kernel-formats mxfp4,nvfp4 --variants "$D S_ROUTED_TILE=1" --out "$OUT/tile.json"
[ "${LAYER:-1}" = 1 ] || exit 0
for w in mxfp4 nvfp4; do
  B="--backend gpu --preset m3.1 --weights $w --layers 12 --per-layer 6 --batch 2,4,8 --context 4096 --iters 40 --rounds 1 --path standard"
  m3_defines_ab 2 "$B" base= "tile=$D S_ROUTED_TILE=1" > "$OUT/tile-layer-$w.log" 2>&1
  echo "=== $w"; cut -c1-150 "$OUT/tile-layer-$w.log"
done
