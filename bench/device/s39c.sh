#!/usr/bin/env bash
# Session 39 (issue 12), any card (an H200 wanted), ~400 s cold. The new
# default (the _d128 attention partials, the split one at 6 CTAs an SM)
# against the plain partials (M3_ATTN_D128=0), interleaved, 3 rounds (after the
# microbench),
# standard path, b1 / b4 / b16 (mono runs its own bodies; its 16-step gate
# still checks the bits) -> ab.log; the kernel microbench in session 32's
# figure-of-record shape (one tall launch 1 x [49152, 6144], grouped gate +
# up 4 and 16 of 128, one launch a replay) -> kern.log; golden through the
# GPU runner and the d128 runner test -> gate.log (GATE=0 leaves it out;
# ROUNDS, default 3).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "=== kernel microbench ($(date +%T))"
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4,16 \
  --kernel-rows 1,16 --kernel-reps 1 --kernel-formats mxfp4,nvfp4,mxfp8 > $OUT/kern.log 2>&1
echo "exit $?"; grep -E "x/row|rror|^ceiling" $OUT/kern.log | cut -c1-150
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
# old: M3_ATTN_D128=0; new: the defaults
m3_env_ab M3_ATTN_D128 "${ROUNDS:-3}" "$B" old=0 new= > $OUT/ab.log 2>&1
grep -E "^===|compiled|\[auto\]|differs|rror|failed" $OUT/ab.log | cut -c1-120
[ "${GATE:-1}" = 1 ] || exit 0
echo "=== gate ($(date +%T))"
{
  M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 120 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -E "golden:|FAIL" | tail -4
  REQUIRE_GPU=1 timeout 60 /tmp/bin/test-runner --test-threads=1 d128 2>&1 | grep -E "^test |^test result|panicked"
} > $OUT/gate.log 2>&1
cat $OUT/gate.log
