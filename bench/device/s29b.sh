#!/usr/bin/env bash
# Session 29 (issue 13), any card: the mono build's one-row / one-tile ops
# of MXFP8 E4M3 and MXFP4 with the unhalved load batch (S_RC_FULL_BATCH,
# mono_prelude.h; no local memory in their walks' loops, NVRTC 13.0).
# check.log: the runner's mono tests (bitwise the standard path). ab.log:
# `m3 bench --path both` (32-step parity gate first), the build against
# S_RC_FULL_BATCH=0 (session 28's halved batch), interleaved, 2 rounds,
# b1 / b4 / b16, per layer. prof.log: the new build's op profile at b1 / b4.
# Ran once (bench/NOTES.md session 29 run 4: 5-7% slower, reverted; the
# knob is gone from the code).
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== test runner mono, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 150 /tmp/bin/test-runner mono_path auto_path wide_mono --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|FAIL" | tail -16
} > $OUT/check.log 2>&1
cat $OUT/check.log
A="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 32"
{
  for r in 1 2; do
    for d in "" "S_RC_FULL_BATCH=0"; do
      echo "=== M3_MONO_DEFINES='$d' round $r ($(date +%T))"
      M3_MONO_DEFINES="$d" timeout 120 /tmp/bin/m3 bench $A 2>&1 | grep -E "^\| \[.*decode.*/|^mono path|differ|rror"
    done
  done
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
timeout 90 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,4 --context 4096 --iters 20 --rounds 1 \
  --path mono --profile > $OUT/prof.log 2>&1
echo "exit $?" >> $OUT/prof.log
grep -E "^mono ops|^ +[0-9]+\+? " $OUT/prof.log | head -40
