#!/usr/bin/env bash
# Session 37 run 2 (issue 13), right after s37a.sh on the same warm
# machine (its kernel cache), ~100 s: 3 rounds interleaved of the a75a8ea
# build (new: two rows a pass), rot (M3_MONO_ROTATE_LATE=1), rotr1 (rot
# and one row a pass, S_F32W_ROWS=1: the defaults since) and r1, each
# after a 16-step gate -> ab2.log; the b1 mono op profile with the
# rotation -> prof-rot-b1.log. The record of what ran (it was one
# command line); rerun at a later build, `new` is rotr1.
. bench/device/common.sh
m3_setup
variant() {
  local v=$1
  shift
  case $v in
    new) "$@" ;;
    rot) env M3_MONO_ROTATE_LATE=1 "$@" ;;
    rotr1) env M3_MONO_ROTATE_LATE=1 M3_MONO_DEFINES=S_F32W_ROWS=1 "$@" ;;
    r1) env M3_MONO_DEFINES=S_F32W_ROWS=1 "$@" ;;
    *) return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_variants 3 "$B" new rot rotr1 r1 > $OUT/ab2.log 2>&1
grep -E "^===|compiled|\[mono\]|differ|rror" $OUT/ab2.log | cut -c1-120
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --path mono --profile"
env M3_MONO_ROTATE_LATE=1 timeout 60 /tmp/bin/m3 bench $P --batch 1 > $OUT/prof-rot-b1.log 2>&1
grep -A20 "^mono ops" $OUT/prof-rot-b1.log | cut -c1-190
