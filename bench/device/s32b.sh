#!/usr/bin/env bash
# Session 32 (issue 13), the second round s32a.sh's call ran out before:
# base, inline, inline+ops and full, each build compiled first on m3.1
# (s32a's tiny warm-up left the m3.1 builds to the timed runs, which the
# 60 s limit cut), interleaved, 2 rounds -> ab2.log; then inline's op
# profile at b1 -> prof-inline.log.
set -u
. bench/device/common.sh
m3_setup
run() {
  local v=$1
  shift
  case $v in
    base) "$@" ;;
    inline) M3_MONO_DEFINES="S_MONO_INLINE_SMALL=1" "$@" ;;
    inline+ops) M3_MONO_DEFINES="S_MONO_INLINE_SMALL=1 S_MONO_OPS_SMEM=1" "$@" ;;
    full) M3_MONO_DEFINES="S_UNROLL_HALF=0" "$@" ;;
  esac
}
W="--backend gpu --preset m3.1 --layers 4 --batch 1,16 --iters 1 --rounds 1 --warmup 1 --parity-steps 0 --path mono"
for v in base inline inline+ops full; do
  run $v timeout 200 /tmp/bin/m3 bench $W > /dev/null 2>&1 &
done
wait
echo "compiled ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for r in 1 2; do
  for v in base inline inline+ops full; do
    echo "=== $v round $r ($(date +%T))"
    run $v timeout 60 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
  done
done > $OUT/ab2.log 2>&1
grep -E "^===|mono\]|differ|rror" $OUT/ab2.log
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --path mono --profile"
run inline timeout 30 /tmp/bin/m3 bench $P > $OUT/prof-inline.log 2>&1
grep -A21 "^mono ops" $OUT/prof-inline.log | cut -c1-140
