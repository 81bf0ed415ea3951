#!/usr/bin/env bash
# Session 26 (issue 12): the MoE layer at b1 / b4 / b16, 2 rounds
# interleaved: f067e34 (.carry/f06.tar.xz, session 25's engine) against
# this build (the walks of run 3 / s26b.sh, RMSNorm's bound computed at
# load); the b1 per-launch profile of both; then the GPU unit tests of the
# linears and producers and the runner's mono-bitwise test (REQUIRE_GPU=1).
set -u
. bench/device/common.sh
m3_setup f06
m3_ab 2 "--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1 --batch 1,4,16" \
  /tmp/f06/m3 /tmp/bin/m3 > $OUT/layer.log 2>&1
cat $OUT/layer.log
for b in f06 bin; do
  echo "=== profile $b"
  timeout 60 /tmp/$b/m3 bench --backend gpu --preset m3.1 --layers 12 --iters 20 --rounds 1 --batch 1 --profile 2>&1 \
    | grep -E " ms .*%.*x[0-9]+" | head -8
done > $OUT/prof.log 2>&1
cat $OUT/prof.log
{
  m3_unit 300 linear pointwise
  echo "=== test runner mono_path_is_bitwise_the_standard_path ($(date +%T))"
  REQUIRE_GPU=1 timeout 150 /tmp/bin/test-runner mono_path_is_bitwise --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|bitwise|FAIL" | tail -12
  echo "=== end ($(date +%T))"
} > $OUT/check.log 2>&1
cat $OUT/check.log
