#!/usr/bin/env bash
# Session 30 (issue 13), any card: the mono path's early start
# (S_MONO_EARLY=1: the grid barrier split into its arrival and a wait in
# the next body, where its own launch waits for PDL) and the lone ops'
# spread (S_MONO_SPREAD=1), each against the build (both 0), interleaved,
# `m3 bench --path both` on m3.1 --layers 12 (MoE-layer rows, standard and
# mono from the same rounds), each run after a 16-step parity gate (every
# step's tokens and logits bit for bit: the early start must keep them).
# The mono variants are compiled first, in parallel (a cold kernel cache
# takes ~40 s a variant). Then the op profile of the early build at b1.
set -u
. bench/device/common.sh
m3_setup
V=("" "S_MONO_EARLY=1" "S_MONO_EARLY=1 S_MONO_SPREAD=1" "S_MONO_SPREAD=1")
for d in "${V[@]}"; do
  M3_MONO_DEFINES="$d" timeout 240 /tmp/bin/m3 bench --backend gpu --preset tiny --batch 1 --iters 1 --rounds 1 \
    --warmup 1 --path mono --parity-steps 0 > /dev/null 2>&1 &
done
wait
echo "compiled ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for d in "" "S_MONO_EARLY=1" "S_MONO_EARLY=1 S_MONO_SPREAD=1" "S_MONO_SPREAD=1" "S_MONO_EARLY=1" ""; do
  echo "=== M3_MONO_DEFINES='$d' ($(date +%T))"
  M3_MONO_DEFINES="$d" timeout 120 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
done > $OUT/ab.log 2>&1
cat $OUT/ab.log
M3_MONO_DEFINES="S_MONO_EARLY=1" timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 \
  --iters 1 --rounds 1 --warmup 0 --batch 1 --path mono --profile > $OUT/prof.log 2>&1
grep -A19 "^mono ops" $OUT/prof.log
