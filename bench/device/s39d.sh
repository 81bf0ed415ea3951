#!/usr/bin/env bash
# Session 39 (issue 12), any card (an H200 wanted), ~120 s cold: the
# kernel microbench's two shapes in one call, MX formats, 1 and 16 rows,
# one launch a case a replay: one tall launch (1 x [49152, 6144]: session
# 32's figure of record) -> tall.log, and the default stack of 8
# [6144, 6144] launches under PDL -> stack.log. The same bytes, so the
# difference in time over 7 launch boundaries is what a boundary costs.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
K="--backend gpu --preset m3.1 --kernels --kernel-experts 4,16 --kernel-rows 1,16 --kernel-reps 1 --kernel-formats mxfp4,nvfp4,mxfp8"
for shape in tall:1x49152 stack:8x6144; do
  echo "=== ${shape%%:*} ($(date +%T))"
  # shellcheck disable=SC2086
  timeout 150 /tmp/bin/m3 bench $K --kernel-stack ${shape#*:} > $OUT/${shape%%:*}.log 2>&1
  echo "exit $?"
  grep -E "x/row|rror|^ceiling" $OUT/${shape%%:*}.log | grep -v experts | cut -c1-150
done
