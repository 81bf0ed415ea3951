#!/usr/bin/env bash
# Session 38 (issues 12, 13), any card, ~480 s. Run 1 (s38a.sh) had the
# sparse attention partial at 25 us of a b4 MoE layer (8.8%) and ~55 us of
# a b16 one (7.9%) on the standard path, far above its bytes (~10 us at
# b16): session 17's Nsight Compute found the partial an
# instruction-latency chain at under 2 warps a scheduler (4 CTAs an SM,
# 108-128 registers). New `_d128` partials (standard_attention.cu,
# `sa_partial<.., VG = 1>`: one output d group a warp, for d <= 128, the
# same products in the same order): the split one built for 8 CTAs an SM
# (64 registers, 52 / 68 bytes of spill; NVRTC 13.0), the sparse one for
# 4 (128, 28 / 28; was 68 / 104). Variants, interleaved, 2 rounds,
# standard and mono (mono runs its own bodies: the 16-step gate says the
# standard path's bits did not move), b1 / b4 / b16 -> ab.log:
#   old   the default (the plain partials, as before)
#   new   M3_ATTN_D128=1 (the d128 partials)
#   v4    d128 with the split at 4 CTAs an SM (the VG change alone)
#   v6    d128 with the split at 6 (77 registers, no spill)
#   r16   d128 with the split up to 16 rows (M3_ATTN_SPLIT_MAX_ROWS, 4)
# VARIANTS="old new" RUNNER=0 cuts it (~220 s: two variants, no tests).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
variant() {
  local v=$1
  shift
  case $v in
    old) "$@" ;;
    new) env M3_ATTN_D128=1 "$@" ;;
    v4) env M3_ATTN_D128=1 M3_ATTN_DEFINES="SA_MINB_SPLIT_D128=4" "$@" ;;
    v6) env M3_ATTN_D128=1 M3_ATTN_DEFINES="SA_MINB_SPLIT_D128=6" "$@" ;;
    r16) env M3_ATTN_D128=1 M3_ATTN_SPLIT_MAX_ROWS=16 "$@" ;;
    *) echo "no variant $v" >&2; return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
# shellcheck disable=SC2086
m3_variants 2 "$B" ${VARIANTS:-old new v4 v6 r16} > $OUT/ab.log 2>&1
grep -E "^===|compiled|\[auto\]|differ|rror|failed" $OUT/ab.log | cut -c1-150
# The runner's tests (d128_attention_is_bitwise_the_same sets the d128
# partials itself; mono_path_is_bitwise_the_standard_path reads
# M3_ATTN_D128=1 from the environment, the other tests do not) -> runner.log.
[ "${RUNNER:-1}" = 1 ] || exit 0
echo "=== test runner, REQUIRE_GPU=1 ($(date +%T))"
M3_ATTN_D128=1 REQUIRE_GPU=1 timeout 200 /tmp/bin/test-runner --test-threads=1 2>&1 | tee $OUT/runner.log | grep -E "^test |^test result|panicked|FAIL" | tail -16
