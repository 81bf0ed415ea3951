#!/usr/bin/env bash
# Session 44 (issue 12), any card, ~420 s cold: routed launches of 2-16
# rows on the `_rs` entry points (S_ROUTED_SMALL=1: the one-row and
# one-tile walks alone, MXFP4 at 5 CTAs an SM, NVFP4 at 4 with fewer
# spills; a slot of 9-16 rows takes the one-tile walk twice). Run 3 of this
# session (s43c.sh, H100; bench/NOTES.md) had the general MXFP4 entry at 5 CTAs an SM run
# its one-tile and one-row walks 8-10% faster L2-fed (16 / 64 experts at 16
# rows) and its 16-row walk 12% slower (4 experts): the `_rs` entries take
# the first without the second. 1. The microbench's grouped gate + up at 4
# and 16 rows over 4 / 16 / 64 of 128 experts (16-row slots at 4 experts:
# the two passes), L2-fed too, MXFP4 and NVFP4: small-step against
# S_ROUTED_SMALL=1 and S_ROUTED_SMALL=1 S_RS_MINB_FP4=6 (rs.log). 2. The
# MoE layer at b4 / b16, 2 rounds interleaved, the defaults against
# S_ROUTED_SMALL=1 (rs-layer.log; LAYER=0 leaves it out).
# (Ran once, session 44 run 4, H100, on this first form; the form was then
# replaced: S_ROUTED_SMALL=1 now sends only MXFP4 routed launches of 9-16
# rows to the general walks at 5 CTAs an SM, and S_RS_MINB_FP4=6 means
# those walks at 6. Rerun now, the script measures the second form.)
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
echo "=== rs ($(date +%T))"
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x16 \
  --kernel-rows 4,16 --kernel-experts 4,16,64 --kernel-l2 --kernel-formats mxfp4,nvfp4 \
  --variants "$D S_ROUTED_SMALL=1;$D S_ROUTED_SMALL=1 S_RS_MINB_FP4=6" \
  --out "$OUT/rs.json" > "$OUT/rs.log" 2>&1
echo "exit $?"; grep -E "experts.*x/row|rror|^ceiling" "$OUT/rs.log" | cut -c1-200
[ "${LAYER:-1}" = 1 ] || exit 0
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 4,16 --context 4096 --iters 40 --rounds 1 --path standard"
m3_defines_ab 2 "$B" base= "rs=$D S_ROUTED_SMALL=1" > "$OUT/rs-layer.log" 2>&1
cut -c1-150 "$OUT/rs-layer.log"
