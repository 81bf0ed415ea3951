#!/usr/bin/env bash
# Session 35 (issue 13), any card, ~400 s. Session 35's in-graph ablation
# (s35c.sh) had mono's MXFP8 linears cost 1.8x the standard path's in a b1
# MoE layer and its MXFP4 experts 1.5x. Called through the op table, the
# one-row walks spill 264-272 bytes (the call's saves, 128 registers, the
# halved batch); inlined into the interpreter (S_MONO_INLINE_LIN=3:
# m3s_mma_e4m3_r1 and m3s_mma_fp4_r1) NVRTC 13.0 gives the interpreter no
# spills, and 32 / 116 bytes with the full batch (S_UNROLL_HALF=0; called,
# 452-480 bytes). The same bits either way (the same walks, the same sum
# order). Variants base, inl (=3), inlfull (=3 + S_UNROLL_HALF=0),
# compiled first, interleaved, 2 rounds, m3.1 --layers 12 --per-layer 6,
# b1 / b4 / b16, --path both, each after a 16-step gate -> ab.log; the b1
# mono op profile of inl and inlfull -> prof-*.log.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
variant() {
  local v=$1
  shift
  case $v in
    base) "$@" ;;
    inl) M3_MONO_DEFINES="S_MONO_INLINE_LIN=3" "$@" ;;
    inlfull) M3_MONO_DEFINES="S_MONO_INLINE_LIN=3 S_UNROLL_HALF=0" "$@" ;;
    *) echo "no variant $v" >&2; return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_variants 2 "$B" base inl inlfull > $OUT/ab.log 2>&1
grep -E "^===|compiled|\[mono\]|differ|rror|failed" $OUT/ab.log | cut -c1-150
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --path mono --profile"
for v in inl inlfull; do
  variant $v timeout 60 /tmp/bin/m3 bench $P > $OUT/prof-$v.log 2>&1
  echo "=== profile $v (exit $?)"; grep -A20 "^mono ops" $OUT/prof-$v.log | cut -c1-140
done
