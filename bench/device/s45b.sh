#!/usr/bin/env bash
# Record of a run at commit 7a96e40: the NVFP4 `_rs` entry it times was
# removed after it (bench/NOTES.md session 45), so S_RS_MINB_NV is refused now.
# Session 45 (issue 12), any card, ~400 s cold: NVFP4 routed launches of
# 9-64 rows on `m3s_mma_nvfp4_rs` (the one-row and one-tile walks alone at
# 4 CTAs an SM, 100 bytes of spill; a slot's 9-16 rows a CTA by the tile
# walk twice), now the default, against the general entry (416 bytes of
# spill, `S_ROUTED_SMALL=0`) and the same entry at 5 CTAs an SM
# (`S_RS_MINB_NV=5`, 592 bytes): the grouped m16 microbench over 4 / 16 /
# 64 experts, L2-fed too (nv.log), then the MoE layer with NVFP4 experts
# (`--weights nvfp4`) at b12 / b16 / b32, 2 rounds interleaved
# (nv-layer.log; LAYER=0 leaves it out).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
echo "=== nv ($(date +%T))"
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x16 \
  --kernel-rows 16 --kernel-experts 4,16,64 --kernel-l2 --kernel-formats nvfp4 \
  --variants "$D S_ROUTED_SMALL=0;$D S_RS_MINB_NV=5" --out "$OUT/nv.json" > "$OUT/nv.log" 2>&1
echo "exit $?"; grep -E "experts.*x/row|rror|^ceiling" "$OUT/nv.log" | cut -c1-200
[ "${LAYER:-1}" = 1 ] || exit 0
B="--backend gpu --preset m3.1 --weights nvfp4 --layers 12 --per-layer 6 --batch 12,16,32 --context 4096 --iters 40 --rounds 1 --path standard"
m3_defines_ab 2 "$B" rs= "general=$D S_ROUTED_SMALL=0" > "$OUT/nv-layer.log" 2>&1
cut -c1-150 "$OUT/nv-layer.log"
