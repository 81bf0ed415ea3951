#!/usr/bin/env bash
# Session 33 (issues 12, 13), any card, ~300 s. The plain linears' L2
# prefetch before their wait (S_PDL_AHEAD, standard_decode.cu: load batches
# of the warp's run brought into L2 before the PDL wait; in the mono build
# that is while the CTA waits at the grid barrier after its share of the
# op before). One define changes both paths (M3_SMALL_STEP_DEFINES feeds
# the mono build too): base (1), 2, 4 and 12 batches (12: a warp's whole
# one-row run of q|k|v in both builds; the mono build's one-row batch is
# one super-chunk, the standard build's two), interleaved, 2 rounds, m3.1
# --layers 12 --per-layer 6 at b1 / b4 / b16, each after a 16-step gate ->
# ab.log; then the mono op profile at b1 with 12 -> prof-ahead12.log.
set -u
. bench/device/common.sh
m3_setup
variant() {
  local v=$1
  shift
  case $v in
    base) "$@" ;;
    ahead*) M3_SMALL_STEP_DEFINES="S_MMA_WARPS=4 S_MMA_MAXBT=2 S_PDL_AHEAD=${v#ahead}" "$@" ;;
    *) echo "no variant $v" >&2; return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_variants 2 "$B" base ahead2 ahead4 ahead12 > $OUT/ab.log 2>&1
grep -E "^===|compiled|\]|differ|rror" $OUT/ab.log
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --path mono --profile"
variant ahead12 timeout 30 /tmp/bin/m3 bench $P > $OUT/prof-ahead12.log 2>&1
grep -A21 "^mono ops" $OUT/prof-ahead12.log | cut -c1-140
