#!/usr/bin/env bash
# Session 14, closing call (issues 12, 13): the committed defaults (shared
# expert beside, o projection prefetched into L2) under REQUIRE_GPU=1:
# runner tests (one stream against beside bitwise, mono bitwise the
# standard path), backend_ops, golden through the GPU, parity small on
# both paths; then the figures of record: m3.1 --layers 12 / 6 at batch
# 1-64 and one 128k sequence, one stream (M3_BESIDE=off) against the
# defaults in the same rounds. SECTIONS picks parts (tests golden record).
# Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
want() { case " ${SECTIONS:-tests golden record} " in *" $1 "*) return 0 ;; esac; return 1; }
step() { echo; echo "=== $* ($(date +%T))"; }
want tests && {
  for t in runner backend_ops; do
    step "test $t"
    REQUIRE_GPU=1 timeout 300 /tmp/bin/test-$t --test-threads=1 --nocapture 2>&1 | grep -E "^test |^test result|panicked|bitwise over|failures:" | tail -40
    echo "exit ${PIPESTATUS[0]}"
  done
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for p in standard mono; do
    step "parity small $p"
    REQUIRE_GPU=1 timeout 60 /tmp/bin/m3 parity --model $CK/small --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
  done
} > $OUT/tests.log 2>&1
want tests && grep -E "===|exit|result|bitwise over|^parity" $OUT/tests.log
want golden && {
  step "golden --backend gpu (REQUIRE_GPU=1)"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -E "golden:|FAIL|fail" | tail -8
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/golden.log 2>&1
want golden && cat $OUT/golden.log
want record && {
  for r in 1 2; do
    for b in off on; do
      step "record beside=$b round $r"
      M3_BESIDE=$b timeout 240 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16,64 --context 4096 --long-context 131072 --iters 40 --rounds 1 \
        --out $OUT/record-$b-$r.json 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/record.log 2>&1
want record && grep -E "===|exit [^0]|[0-9] / [0-9]|131072" $OUT/record.log | head -60
