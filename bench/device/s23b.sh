#!/usr/bin/env bash
# Session 23 (issue 12), prepared after the session's one device call:
# run 1's two prototype findings carried into the engine: E2M1 weights
# interleaved by 16-row tiles (model/layout.rs, 00d47d1) and row-scaled x
# (RMSNorm / SwiGLU write one power of two a row; the fast walks multiply
# it once an output: PathOptions::row_scaled_x, M3_ROW_SCALED_X=0|1).
# Also SwiGLU in the gate + up epilogue (PathOptions::fuse_swiglu, off by
# default, M3_FUSE_SWIGLU=1) and the MoE combine in the next RMSNorm
# (PathOptions::fold_combine, off by default, M3_FOLD_COMBINE=1).
# 1. the device check: the GPU unit tests of the linears (f64 variants,
#    K = 160 partial chunks, row-scaled x flagged and not: the same bits;
#    SwiGLU in the epilogue against gate + up then m3s_swiglu: the same
#    bits) and of the producers (row-scaled RMSNorm / SwiGLU rows exact),
#    the mono path bitwise the standard one with both folds on, then
#    m3_verify (runner incl. fused_swiglu_ / folded_combine_is_bitwise_the_same,
#    backend_ops incl. K = 160 / 224 engine linears, golden, parity small
#    standard and mono);
# The timing A/B is s23c.sh (a call of its own: this one takes ~5 min).
set -u
. bench/device/common.sh
m3_setup
{
  m3_unit 300 linear pointwise
  echo "=== test runner mono_path_is_bitwise_the_standard_path, both folds on ($(date +%T))"
  M3_FOLD_COMBINE=1 M3_FUSE_SWIGLU=1 REQUIRE_GPU=1 timeout 240 /tmp/bin/test-runner mono_path_is_bitwise \
    --test-threads=1 --nocapture 2>&1 | grep -E "^test |^test result|panicked|bitwise|FAIL" | tail -12
  m3_verify
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
