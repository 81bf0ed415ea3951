#!/usr/bin/env bash
# Session 19 (issue 12): FP8 weights in a coalesced device layout. s19c's
# Nsight Compute found the MXFP8 one-row kernel at 86% of L2 throughput
# with 47% excess sectors: lane t's 32 bytes of a chunk at 32t put each of
# its two 16-byte loads on four half-used sectors, fetched twice (the loads
# skip L1). Now lane t's loads sit at 16t and 64 + 16t (model/layout.rs).
# 1. verify (REQUIRE_GPU=1, m3_verify); 2. old (a7969ff: the same kernels
# but the layout) against new, interleaved, 2 rounds, per MoE layer b1 /
# b4 / b16 at 4k; the MXFP8 microbench (8 launches and one tall launch,
# rows 1 / 4 / 16) both builds.
set -u
. bench/device/common.sh
m3_setup old
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40"
{
  for r in 1 2; do
    for b in old bin; do
      echo "=== $b round $r ($(date +%T))"
      timeout 150 /tmp/$b/m3 bench $B --rounds 1 --context 4096 --batch 1,4,16 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
  for b in old bin; do
    for st in "" 1x49152; do
      echo "=== $b microbench mxfp8 stack '$st' ($(date +%T))"
      timeout 150 /tmp/$b/m3 bench --backend gpu --preset m3.1 --kernels --kernel-rows 1,4,16 --kernel-formats mxfp8 \
        --kernel-stack "$st" --kernel-experts 4,16 2>&1 | grep -E "^\||rror" | grep -v "| default |"
    done
  done
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
