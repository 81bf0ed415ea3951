#!/usr/bin/env bash
# Session 7 runs 6-7: sparse attention's selected blocks split in 4 CTAs each
# (m3s_attn_partial_split, tiles of 32 keys) after run 5's Nsight Compute
# (64 CTAs of one long serial chain each at batch 1); run 7: only for
# steps of at most 8 rows (BATCH=1,4,8,16,64). Tests (runner:
# decode == prefill bit for bit, the CPU runner case by case), golden
# through the GPU, parity on small, then the step with m3-old (one CTA a
# block, as committed before) and m3 in the same call, and m3's profile.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
want() { case " ${SECTIONS:-tests golden layers} " in *" $1 "*) return 0 ;; esac; return 1; }
want tests && {
  step "test runner"
  timeout 200 /tmp/bin/test-runner --test-threads=1 --nocapture 2>&1 | grep -E "^test .*(ok|FAILED)$|result|panicked|decode vs prefill" | tail -30
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/tests.log 2>&1
want golden && {
  step "golden --backend gpu"
  M3_BIN=$M3 M3_ROOT=$PWD timeout 200 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -E "golden:|FAIL|fail" | tail -8
  echo "exit ${PIPESTATUS[0]}"
  CK=/tmp/ck; mkdir -p $CK
  $M3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for kv in bf16 fp8_e4m3; do
    step "parity small kv $kv"
    timeout 150 $M3 parity --model $CK/small --reference cpu --backend gpu --kv-dtype $kv --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity" | tail -3
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/golden.log 2>&1
want layers && {
  for b in m3-old m3; do
    step "bench $b"
    timeout 200 /tmp/bin/$b bench --backend gpu --preset m3.1 --layers 12 --batch ${BATCH:-1,4,16,64} --context 4096 \
      --long-context 131072 --iters 40 --rounds 2 --out $OUT/split-$b.json 2>&1 | grep "decode\|ceiling"
    echo "exit ${PIPESTATUS[0]}"
  done
  step "profile m3 b1"
  timeout 100 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1 --context 4096 --iters 5 --rounds 1 --profile 2>&1 | grep -A8 "^profile"
} > $OUT/layers.log 2>&1
echo done
