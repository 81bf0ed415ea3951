#!/usr/bin/env bash
# Session 11's last check of the refactored MX linear (shared row, segment
# and epilogue helpers): runner tests under REQUIRE_GPU=1 (standard and mono
# paths) and parity tiny / small. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
{
  timeout 110 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test .*FAILED|^test result|panicked" | tail -8
  CK=/tmp/ck; mkdir -p $CK
  for m in tiny small; do
    /tmp/bin/m3 synth --preset $m --experts mxfp4 --dense mxfp8 --out $CK/$m --draft-layers 0 -q
    for p in standard mono; do
      timeout 40 /tmp/bin/m3 parity --model $CK/$m --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
    done
  done
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
