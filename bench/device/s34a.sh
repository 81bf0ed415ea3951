#!/usr/bin/env bash
# Session 34 (issues 12, 13), any card, ~210 s. A contiguous fast walk
# brings the batch S_H_L2_AHEAD batches past the one it loads into L2
# (standard_decode.cu; prefetches hold no registers: the mono build's
# halved batch keeps ~1 KB of MXFP4 codes a warp in flight; NVRTC 13.0:
# no new spills in the one-row / one-tile entries, mono 128 registers and
# 800 bytes of stack). One define changes both paths (M3_SMALL_STEP_DEFINES
# feeds the mono build, whose pipelined walks stay on: MONO_DEFAULTS names
# other defines). base (0), 1, 2 and 4, interleaved, 2 rounds, m3.1
# --layers 12 --per-layer 6 at b1 / b4 / b16, each after a 16-step gate ->
# ab.log.
set -u
. bench/device/common.sh
m3_setup
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
m3_defines_ab 2 "$B" base= "l2a1=$S S_H_L2_AHEAD=1" "l2a2=$S S_H_L2_AHEAD=2" "l2a4=$S S_H_L2_AHEAD=4" > $OUT/ab.log 2>&1
grep -E "^===|compiled|\]|differ|rror" $OUT/ab.log
