#!/usr/bin/env bash
# Prepared in session 17 for the next session's first call (issue 12):
# 1. verify: the device check of session 17's host change (routed experts
#    past 8 rows without PDL, through Launcher::full_edges): runner tests,
#    backend_ops, golden through the GPU, parity small on both paths, all
#    under REQUIRE_GPU=1 (no kernel source changed in session 17);
# 2. edge: the o projection's full edge without the side stream
#    (M3_O_FULL_EDGE=1 M3_L2_PREFETCH_MIB=0) against the defaults (the
#    prefetch's fork / join) and both together; interleaved processes, 2
#    rounds, per MoE layer at b1 / b4 / b16;
# 3. record: the figures of record, b1-64 at 4k and b1 at 128k.
# SECTIONS picks parts (verify edge record). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
want() { case " ${SECTIONS:-verify edge record} " in *" $1 "*) return 0 ;; esac; return 1; }
want verify && {
  for t in runner backend_ops; do
    echo "=== test $t, REQUIRE_GPU=1 ($(date +%T))"
    REQUIRE_GPU=1 timeout 240 /tmp/bin/test-$t --test-threads=1 --nocapture 2>&1 | grep -E "^test |^test result|panicked|bitwise|FAIL" | tail -24
  done
  echo "=== golden --backend gpu ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -E "golden:|FAIL|fail" | tail -8
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for p in standard mono; do
    echo "=== parity small $p ($(date +%T))"
    REQUIRE_GPU=1 timeout 60 /tmp/bin/m3 parity --model $CK/small --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
  done
} > $OUT/verify.log 2>&1
want verify && cat $OUT/verify.log
want edge && {
  for r in 1 2; do
    for e in "M3_NONE=1" "M3_O_FULL_EDGE=1 M3_L2_PREFETCH_MIB=0" "M3_O_FULL_EDGE=1"; do
      echo "=== '$e' round $r ($(date +%T))"
      env $e timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 50 --rounds 1 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/edge.log 2>&1
want edge && cat $OUT/edge.log
want record && {
  timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
    --batch 1,4,16,32,64 --context 4096 --long-context 131072 --iters 40 --rounds 2 \
    --out $OUT/record.json 2>&1 | grep -E "^\||MoE|per layer|rror"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/record.log 2>&1
want record && grep -E "exit [^0]|[0-9] / [0-9]|131072" $OUT/record.log | head -40
