#!/usr/bin/env bash
# Session 9's closing call: golden through the GPU and every runner test
# (the mono test among them: the rebuilt interpreter, the half-unroll
# linears and the register-resident RMSNorm stand-in, all defaults now),
# then both paths in the same rounds, then the mono op profile at b1.
# Golden runs without REQUIRE_GPU: the NVFP4-cache cases are CPU-only
# (the GPU refuses that cache) and are reported skipped; every other case
# must pass.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
{
  M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 120 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -E "golden:|FAIL|skip" | tail -8
  echo "exit ${PIPESTATUS[0]}"
  REQUIRE_GPU=1 timeout 240 /tmp/bin/test-runner --test-threads=1 --nocapture 2>&1 | grep -E "^test |result|panicked|mono steps" | tail -16
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/gate.log 2>&1
cat $OUT/gate.log
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --path both --out $OUT/both.json > $OUT/both.log 2>&1
echo "exit $?" >> $OUT/both.log
grep -E "^mono|^\| \[|exit" $OUT/both.log | tail -8
timeout 60 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 1 --context 4096 --iters 5 --rounds 1 \
  --path mono --profile > $OUT/prof.log 2>&1
grep -A22 "^mono ops" $OUT/prof.log | head -23
