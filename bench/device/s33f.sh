#!/usr/bin/env bash
# Session 33 (issue 13), any card, ~220 s. After s33e.sh (H100: mono b4
# -2.8%, b16 -3.6%, b1 +1.7% with every walk pipelined): which walks. The
# pipelined fast walk in the mono build: there the load batch is halved (S_UNROLL_HALF, 1 KB of MXFP4
# codes a warp in flight, none while it decodes) and the pipelined walk
# keeps the kernel at 128 registers and 800 bytes of stack (NVRTC 13.0; its
# innermost-loop spills 15 / 22 -> 4 / 21 in one op body, 52 / 54 -> 42 / 61
# in another). The define feeds both builds (M3_SMALL_STEP_DEFINES); the
# standard path's one-row entries spill with it at their default CTAs an SM,
# so read the mono rows. base, tile (S_H_PIPE_TILE=30: every MX one-tile
# walk), tile4 (and MXFP4's one-row walk) and all (every one-row walk
# too), interleaved, 2 rounds, m3.1 --layers 12 --per-layer 6 at b1 / b4 / b16, each after a 16-step gate -> ab.log.
set -u
. bench/device/common.sh
m3_setup
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
m3_defines_ab 2 "$B" base= "tile=$S S_H_PIPE_TILE=30" "tile4=$S S_H_PIPE_TILE=30 S_H_PIPE_ONE=4" \
  "all=$S S_H_PIPE_ONE=30 S_H_PIPE_TILE=30" > $OUT/ab.log 2>&1
grep -E "^===|compiled|\]|differ|rror" $OUT/ab.log
