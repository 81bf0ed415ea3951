#!/usr/bin/env bash
# Session 18, call 2 (issue 12): E4M3 -> bf16 / f32 by the hardware
# conversion in the attention and indexer kernels (m3_e4m3x2_bf16x2; the
# same values, bit for bit), and the index scores on tensor cores
# (si_scores_mma). Carries .carry/bin.tar.xz (the new build, both),
# .carry/mid.tar.xz (m3 with the conversion only) and .carry/old.tar.xz
# (m3 of fe3b2e6).
# 1. verify: backend_ops and golden through the GPU, parity small (fp8
#    cache) standard and mono under REQUIRE_GPU=1; old and new m3 generate
#    the same greedy tokens past the top-k window (small, 700 tokens);
# 2. ab: old vs mid vs new, interleaved processes, 2 rounds, per MoE layer at
#    b1 / b4 / b16 (4k) and b1 at 128k.
set -u
mkdir -p /tmp/bin /tmp/old /tmp/mid && tar -C /tmp/bin -xJf .carry/bin.tar.xz && tar -C /tmp/old -xJf .carry/old.tar.xz && tar -C /tmp/mid -xJf .carry/mid.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
want() { case " ${SECTIONS:-verify ab} " in *" $1 "*) return 0 ;; esac; return 1; }
want verify && {
  echo "=== test runner (standard path against the CPU), REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 200 /tmp/bin/test-runner --test-threads=1 --nocapture gpu_runner_matches 2>&1 | grep -E "^test |^test result|panicked|FAIL|first discrete|blocks differ [1-9]" | tail -12
  echo "=== test backend_ops, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 120 /tmp/bin/test-backend_ops --test-threads=1 2>&1 | grep -E "^test |^test result|panicked|FAIL" | tail -8
  echo "=== golden --backend gpu ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -E "golden:|FAIL|fail" | tail -8
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for p in standard mono; do
    echo "=== parity small $p ($(date +%T))"
    REQUIRE_GPU=1 timeout 60 /tmp/bin/m3 parity --model $CK/small --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 --kv-dtype fp8_e4m3 2>&1 | grep -E "^parity|rror" | tail -1
  done
  for b in old mid bin; do
    timeout 120 /tmp/$b/m3 generate --model $CK/small --backend gpu --kv-dtype fp8_e4m3 --prompt "the quick brown fox" \
      --max-tokens 700 --temperature 0 > /tmp/gen-$b.log 2>&1
    echo "generate $b: rc $?"
    grep -o "tokens \[.*\]" /tmp/gen-$b.log > /tmp/gen-$b.txt
    echo "  $(wc -c < /tmp/gen-$b.txt) bytes of token ids, md5 $(md5sum < /tmp/gen-$b.txt | cut -c1-12)"
  done
  [ -s /tmp/gen-mid.txt ] && cmp /tmp/gen-old.txt /tmp/gen-mid.txt && echo "old == mid: identical greedy tokens (700)" || echo "old != mid: TOKENS DIFFER (or none)"
  [ -s /tmp/gen-bin.txt ] && cmp /tmp/gen-old.txt /tmp/gen-bin.txt && echo "old == new: identical greedy tokens (700)" || echo "old != new: tokens differ (or none)"
  grep -v "tokens \[" /tmp/gen-bin.log | tail -3
} > $OUT/verify.log 2>&1
want verify && cat $OUT/verify.log
want ab && {
  for r in 1 2; do
    for b in old mid bin; do
      echo "=== $b round $r ($(date +%T))"
      timeout 150 /tmp/$b/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --long-context 131072 --iters 40 --rounds 1 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ab.log 2>&1
want ab && cat $OUT/ab.log
