#!/usr/bin/env bash
# Session 12, call 6: after the two MX walks' block body became one helper
# (s_h_block; NVRTC 13.0 SASS of every MX entry point's loops identical
# but for register moves in m3s_mma_nvfp4_r1): the linear's f64 variant
# test, runner tests and parity on both paths under REQUIRE_GPU=1, then
# the one-row microbench. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg REQUIRE_GPU=1
{
  timeout 120 /tmp/bin/test-m3_gpu variants_match_an_f64_reference --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tail -3
  timeout 150 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test .*FAILED|^test result|panicked" | tail -5
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts nvfp4 --dense mxfp8 --out $CK/small-nv --draft-layers 0 -q
  for p in standard mono; do
    timeout 40 /tmp/bin/m3 parity --model $CK/small-nv --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
  done
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
unset REQUIRE_GPU
timeout 60 /tmp/bin/m3 bench --backend gpu --kernels --preset m3.1 --kernel-formats mxfp4,mxfp8,nvfp4 \
  --kernel-rows 1 --kernel-experts 4 --iters 30 --out $OUT/kernels.json > $OUT/kernels.log 2>&1
echo "kernels exit $?"
grep -E " m1 \|" $OUT/kernels.log | grep -v "| default |" | cut -d'|' -f2-9
