#!/usr/bin/env bash
# Prepared in session 18 for the next session's first call (issue 12).
# The MXFP4 fast entry's block factors from one add to the scale word
# (standard_decode.cu s_h_block: E2M1's 2^6 added to all four scale bytes
# at once; same values by construction; the m3s_mma_fp4_r1 loop 310 -> 280
# SASS instructions) is NOT yet run on the device.
# Carries .carry/bin.tar.xz (new) and .carry/old.tar.xz (m3 of a7969ff).
# 1. verify (REQUIRE_GPU=1): runner tests (all 8: mono bitwise, GPU vs
#    CPU), backend_ops, golden through the GPU, parity small (MXFP4
#    experts) standard and mono;
# 2. ab: old vs new, interleaved, 2 rounds, per MoE layer b1 / b4 / b16 at
#    4k and b1 at 128k; the MXFP4 microbench (m = 1, 4, 16) both builds;
# 3. record: the figures of record, b1-64 at 4k and b1 at 128k.
set -u
. bench/device/common.sh
m3_setup old
want() { case " ${SECTIONS:-verify ab record} " in *" $1 "*) return 0 ;; esac; return 1; }
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40"
want verify && m3_verify > $OUT/verify.log 2>&1
want verify && cat $OUT/verify.log
want ab && {
  for r in 1 2; do
    for b in old bin; do
      echo "=== $b round $r ($(date +%T))"
      timeout 150 /tmp/$b/m3 bench $B --rounds 1 --context 4096 --batch 1,4,16 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
  for b in old bin; do
    echo "=== $b microbench mxfp4 ($(date +%T))"
    timeout 200 /tmp/$b/m3 bench --backend gpu --preset m3.1 --kernels --kernel-rows 1,4,16 --kernel-formats mxfp4 2>&1 | grep -E "^\||rror" | head -30
  done
} > $OUT/ab.log 2>&1
want ab && cat $OUT/ab.log
want record && {
  timeout 300 /tmp/bin/m3 bench $B --batch 1,4,16,32,64 --context 4096 --long-context 131072 --rounds 2 \
    --out $OUT/record.json 2>&1 | grep -E "^\||MoE|per layer|rror"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/record.log 2>&1
want record && grep -E "exit [^0]|[0-9] / [0-9]|131072" $OUT/record.log | head -40
