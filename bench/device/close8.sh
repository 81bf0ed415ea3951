#!/usr/bin/env bash
# Session 8's closing call: golden through the GPU and every runner test
# (m3s_rmsnorm now 256 threads with 32 values a thread in registers; the
# mono test among them), then both paths in the same rounds.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
{
  M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 120 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -E "golden:|FAIL" | tail -6
  echo "exit ${PIPESTATUS[0]}"
  timeout 240 /tmp/bin/test-runner --test-threads=1 --nocapture 2>&1 | grep -E "^test |result|panicked|mono steps" | tail -16
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/gate.log 2>&1
cat $OUT/gate.log
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --path both --out $OUT/both.json > $OUT/both.log 2>&1
echo "exit $?" >> $OUT/both.log
grep -E "^mono|^\| |exit" $OUT/both.log | tail -24
