#!/usr/bin/env bash
# Session 31 (issue 13), any card: a shared phase's order. The routed
# chain's op first (M3_MONO_MAIN_FIRST=1: the router on CTAs of its own,
# the shared expert's gate / up on the CTAs it leaves idle) against the
# shared expert's first (=0, session 30's program), and phases off
# (M3_MONO_PAIR=0), interleaved, 2 rounds, `m3 bench --path both` on
# m3.1 --layers 12 --per-layer 6 at b1 / b4 / b16, each after a 16-step
# parity gate -> ab.log; then the op profile of the new default at b1 / b16
# -> prof.log.
set -u
. bench/device/common.sh
m3_setup
echo "=== compile ($(date +%T))"
timeout 200 /tmp/bin/m3 bench --backend gpu --preset tiny --batch 1 --iters 1 --rounds 1 --warmup 1 --path both \
  --parity-steps 0 > /dev/null 2>&1
echo "compiled ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for r in 1 2; do
  for v in "M3_MONO_MAIN_FIRST=1" "M3_MONO_MAIN_FIRST=0" "M3_MONO_PAIR=0"; do
    echo "=== $v round $r ($(date +%T))"
    env $v timeout 60 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
  done
done > $OUT/ab.log 2>&1
grep -E "^===|mono\]|differ|rror" $OUT/ab.log
echo "=== profile ($(date +%T))"
timeout 40 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 \
  --batch 1,16 --path mono --profile > $OUT/prof.log 2>&1
grep -A21 "^mono ops" $OUT/prof.log | cut -c1-150
echo "=== done ($(date +%T))"
