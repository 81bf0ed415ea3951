#!/usr/bin/env bash
# Prepared in session 15 for the next session's first call (issue 12):
# 1. the device check of session 15's last kernel change (both cache
#    stores through s_cache_store): runner tests (fused cache writes bitwise
#    the separate launch in every cache kind, the CPU comparison, mono
#    bitwise), backend_ops (cache_write bit-exact), golden through the GPU,
#    parity small on both paths, all under REQUIRE_GPU=1;
# 2. s15f.sh's experiment: the MXFP8 one-row linears at 5 CTAs an SM
#    (the MoE layer's 616-CTA qkv launch in one wave) against 4, same
#    process, same rounds, b1 and b4;
# 3. s15e.sh's per-launch profile of steps of 16, 32 and 64 rows.
# SECTIONS picks parts (verify minb profile). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
want() { case " ${SECTIONS:-verify minb profile} " in *" $1 "*) return 0 ;; esac; return 1; }
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
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
want minb && {
  timeout 250 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4 --context 4096 \
    --iters 60 --rounds 2 --variants "$B;$B S_R1_MINB_FP8=5"
  echo "exit $?"
} > $OUT/minb.log 2>&1
want minb && grep -E "^\| |per layer|exit" $OUT/minb.log | grep -v "^|---" | tail -30
want profile && for b in 16 32 64; do
  timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch $b --context 4096 \
    --iters 3 --rounds 1 --profile 2>&1 | grep -A24 "^profile"
done > $OUT/profile.log 2>&1
want profile && cat $OUT/profile.log
