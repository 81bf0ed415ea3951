#!/usr/bin/env bash
# Session 18, call 3 (issue 12): the index scores' first key tile before
# the dependency wait (M3_INDEX_PREWAIT, default on) and their grid
# (M3_INDEX_GRID_X) at 128k; what the attention chain costs now.
# Carries .carry/bin.tar.xz (new) and .carry/old.tar.xz (m3 of 4cff99d).
# 1. verify (REQUIRE_GPU=1): runner tests gpu_runner_matches (standard vs
#    CPU) and mono_path (mono bitwise the standard path: decode steps take
#    the pre-wait load), parity small fp8 cache standard;
# 2. ab: old vs new vs new with M3_INDEX_PREWAIT=0, 2 rounds, b1/b4/b16 +
#    b1 at 128k;
# 3. grid: M3_INDEX_GRID_X=128 / 512 / 1024 at 128k (b1, b4), 256 the default;
# 4. ablate: M3_SKIP_LAUNCHES per attention launch at b1 / b4.
set -u
mkdir -p /tmp/bin /tmp/old && tar -C /tmp/bin -xJf .carry/bin.tar.xz && tar -C /tmp/old -xJf .carry/old.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
want() { case " ${SECTIONS:-verify ab grid ablate} " in *" $1 "*) return 0 ;; esac; return 1; }
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
want verify && {
  echo "=== runner tests (standard vs CPU, mono bitwise), REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 260 /tmp/bin/test-runner --test-threads=1 --nocapture gpu_runner_matches mono_path 2>&1 | grep -E "^test |^test result|panicked|FAIL|first discrete|blocks differ [1-9]|mono ==" | tail -14
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  echo "=== parity small standard fp8 cache ($(date +%T))"
  REQUIRE_GPU=1 timeout 60 /tmp/bin/m3 parity --model $CK/small --reference cpu --backend gpu --prompts 8 --max-tokens 32 --kv-dtype fp8_e4m3 2>&1 | grep -E "^parity|rror" | tail -1
} > $OUT/verify.log 2>&1
want verify && cat $OUT/verify.log
want ab && {
  for r in 1 2; do
    for e in "old M3_NONE=1" "bin M3_NONE=1" "bin M3_INDEX_PREWAIT=0"; do
      set -- $e
      echo "=== $1 $2 round $r ($(date +%T))"
      env $2 timeout 150 /tmp/$1/m3 bench $B --context 4096 --batch 1,4,16 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ab.log 2>&1
want ab && cat $OUT/ab.log
want grid && {
  for g in 128 512 1024 256; do
    echo "=== M3_INDEX_GRID_X=$g ($(date +%T))"
    M3_INDEX_GRID_X=$g timeout 150 /tmp/bin/m3 bench $B --batch 1,4 --context 131072 2>&1 | grep -E "^\| decode.*/|rror"
  done
} > $OUT/grid.log 2>&1
want grid && cat $OUT/grid.log
want ablate && {
  for s in none attn_partial index_scores attn_combine index_topk headnorm_rope none; do
    echo "=== M3_SKIP_LAUNCHES=$s ($(date +%T))"
    M3_SKIP_LAUNCHES=$s timeout 150 /tmp/bin/m3 bench $B --context 4096 --batch 1,4 2>&1 | grep -E "^\| decode.*/|rror|ABLATION" | head -4
  done
} > $OUT/ablate.log 2>&1
want ablate && cat $OUT/ablate.log
