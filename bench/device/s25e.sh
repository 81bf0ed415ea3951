#!/usr/bin/env bash
# Session 25, prepared for the next device session (run it before
# s25d.sh): the linears' GPU unit tests on the device with room for a
# cold kernel cache (s25a.sh's 200 s cut them off): every variant against
# the f64 reference, nvfp4-wide's subnormal block scales (the NVFP4 fold),
# the row-scaled flag's bit equality (MXFP8's one-row walk now per block),
# SwiGLU in the epilogue; then the producers.
set -u
. bench/device/common.sh
m3_setup
{
  m3_unit 480 linear pointwise
  echo "=== end ($(date +%T))"
} > $OUT/check.log 2>&1
cat $OUT/check.log
