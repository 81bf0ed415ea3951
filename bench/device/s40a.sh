#!/usr/bin/env bash
# Session 40 (issue 12), any card (an H200 wanted), ~200 s cold. The
# kernel microbench, one call, MX formats and bf16:
#   tall.log   one tall launch 1 x [49152, 6144] (the figure of record) at
#              1, 2, 4, 8, 16 rows, and the grouped gate + up over 4, 16
#              and 64 of 128 experts;
#   SHAPE.log  8 launches of [6144 | 8448 | 12288, 6144] at 1 and 16 rows
#              (384 / 528 / 768 CTAs a launch at 16 features a CTA: what
#              a launch boundary and a partial wave cost; s39d.sh's cases);
# then golden through the GPU runner (gate.log; GATE=0 leaves it out).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
K="--backend gpu --preset m3.1 --kernels --kernel-reps 1"
echo "=== tall ($(date +%T))"
timeout 200 /tmp/bin/m3 bench $K --kernel-stack 1x49152 --kernel-experts 4,16,64 --kernel-rows 1,2,4,8,16 \
  --kernel-formats mxfp4,nvfp4,mxfp8,mxfp8-e5m2,bf16 > $OUT/tall.log 2>&1
echo "exit $?"
grep -E "x/row|bf16|rror|^ceiling" $OUT/tall.log | grep -v default | cut -c1-150
for shape in s6144:8x6144 s8448:8x8448 s12288:8x12288; do
  echo "=== ${shape%%:*} ($(date +%T))"
  # shellcheck disable=SC2086
  timeout 100 /tmp/bin/m3 bench $K --kernel-experts "" --kernel-rows 1,16 --kernel-formats mxfp4,nvfp4,mxfp8 \
    --kernel-stack ${shape#*:} > $OUT/${shape%%:*}.log 2>&1
  echo "exit $?"
  grep -E "x/row|rror|^ceiling" $OUT/${shape%%:*}.log | cut -c1-150
done
[ "${GATE:-1}" = 1 ] || exit 0
echo "=== gate ($(date +%T))"
REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 150 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 \
  | grep -E "golden:|FAIL|fail" | tail -6 > $OUT/gate.log
cat $OUT/gate.log
