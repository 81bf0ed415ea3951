#!/usr/bin/env bash
# Session 33 (issues 12, 13), any card, ~300 s. The plain linears' L2
# prefetch before their wait (S_PDL_AHEAD, standard_decode.cu: load batches
# of the warp's run brought into L2 before the PDL wait; in the mono build
# that is while the CTA waits at the grid barrier after its share of the
# op before). One define changes both paths (M3_SMALL_STEP_DEFINES feeds
# the mono build too): base (1), 2, 3 and 8 (a warp's whole run at one
# row), interleaved, 2 rounds, m3.1 --layers 12 --per-layer 6 at b1 / b4 /
# b16, each after a 16-step gate -> ab.log; then the mono op profile at b1
# with 8 -> prof-ahead8.log.
set -u
. bench/device/common.sh
m3_setup
variant() {
  local v=$1
  shift
  case $v in
    base) "$@" ;;
    ahead*) M3_SMALL_STEP_DEFINES="S_MMA_WARPS=4 S_MMA_MAXBT=2 S_PDL_AHEAD=${v#ahead}" "$@" ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_variants 2 "$B" base ahead2 ahead3 ahead8 > $OUT/ab.log 2>&1
grep -E "^===|compiled|\]|differ|rror" $OUT/ab.log
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --path mono --profile"
variant ahead8 timeout 30 /tmp/bin/m3 bench $P > $OUT/prof-ahead8.log 2>&1
grep -A21 "^mono ops" $OUT/prof-ahead8.log | cut -c1-140
