#!/usr/bin/env bash
# Session 15, call 3 (issue 12): K, V and the index key written to their
# caches by the head-norm launch (PathOptions::fuse_cache_writes, one
# launch a layer fewer) and the small-step tensor-core shape up to 512
# rows (runs 1-2's crossover), both defaults now. Correctness first under
# REQUIRE_GPU=1: runner tests (the new fused_cache_writes_are_bitwise_the_same,
# the CPU comparison's prefill on the 8-warp build), the draft (it takes
# the same threshold), backend_ops, golden through the GPU, parity small
# (MXFP4 and NVFP4 experts) on both paths. Then ms per MoE layer, the
# cache writes apart (M3_FUSE_CACHE_WRITES=0) against fused, interleaved.
# Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
{
  for t in ${TESTS:-runner draft backend_ops}; do
    echo "=== test $t, REQUIRE_GPU=1 ($(date +%T))"
    REQUIRE_GPU=1 timeout 240 /tmp/bin/test-$t --test-threads=1 --nocapture 2>&1 | grep -E "^test |^test result|panicked|bitwise|FAIL" | tail -24
  done
  echo "=== golden --backend gpu ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -E "golden:|FAIL|fail" | tail -8
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts nvfp4 --dense mxfp8 --out $CK/small-nv --draft-layers 0 -q
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for m in small small-nv; do
    for p in standard mono; do
      echo "=== parity $m $p ($(date +%T))"
      REQUIRE_GPU=1 timeout 60 /tmp/bin/m3 parity --model $CK/$m --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
    done
  done
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
{
  for r in $(seq 1 ${ROUNDS:-2}); do
    for f in 0 1; do
      echo "=== layers fuse_cache_writes=$f round $r ($(date +%T))"
      M3_FUSE_CACHE_WRITES=$f timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 60 --rounds 1 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/layers.log 2>&1
grep -E "===|exit|MoE layer" $OUT/layers.log | head -40
