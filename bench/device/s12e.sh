#!/usr/bin/env bash
# Session 12, call 5: mono maps the one-row / one-tile linears to its
# linear ops (run 4: "not a mono op"); runner tests and parity on both
# paths under REQUIRE_GPU=1, then the kernel microbench of the committed
# defaults against S_H_FAST=0. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg REQUIRE_GPU=1
{
  timeout 170 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test .*FAILED|^test result|panicked" | tail -5
  CK=/tmp/ck; mkdir -p $CK
  for m in tiny small; do
    /tmp/bin/m3 synth --preset $m --experts mxfp4 --dense mxfp8 --out $CK/$m --draft-layers 0 -q
    for p in standard mono; do
      timeout 60 /tmp/bin/m3 parity --model $CK/$m --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
    done
  done
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
unset REQUIRE_GPU
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
timeout 200 /tmp/bin/m3 bench --backend gpu --kernels --preset m3.1 --kernel-formats mxfp4,mxfp8,nvfp4 \
  --kernel-rows 1,4,16 --kernel-experts 4,64 --iters 30 --variants "$S S_H_FAST=0" \
  --out $OUT/kernels.json > $OUT/kernels.log 2>&1
echo "kernels exit $?"
grep -E " m(1|4|16) \|" $OUT/kernels.log | grep -v "| default |" | sed 's/S_MMA_WARPS=4 S_MMA_MAXBT=2/S/' | cut -d'|' -f2-9
