#!/usr/bin/env bash
# Session 34 (issues 12, 13), any card, ~560 s. s34b.sh again with longer
# compile time: its profiles of the new mono build printed nothing past the
# ceiling in 60 s (cold kernel caches after a 200 s warm-up of three
# processes at once that did not finish; fit=0's did). The router with its
# arrays sized to the model's experts and one fence a CTA (S_ROUTER_FIT,
# new default 1; the same bits) against the build before (/tmp/old):
# 1. every kernel compiled, new and old at once (m3.1 --layers 4, 1 / 4 /
#    16 rows, both paths; 330 s each) -> compile-*.log;
# 2. op profiles at b1, mono: the new build, and its router as three ops
#    (M3_MONO_ROUTER_SPLIT=1: the parts apart) -> prof-*.log;
# 3. interleaved A/B new vs old, 2 rounds, m3.1 --layers 12 --per-layer 6,
#    b1 / b4 / b16, --path both, each after a 16-step gate -> ab.log;
# 4. m3_verify on the new build (every runner test: mono bitwise the
#    standard path, the GPU runner against the CPU; backend_ops; golden
#    through the GPU; parity small on both paths) -> verify.log.
set -u
. bench/device/common.sh
m3_setup old
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
W="--backend gpu --preset m3.1 --layers 4 --batch 1,4,16 --iters 1 --rounds 1 --warmup 1 --parity-steps 0 --path both"
for b in bin old; do
  { timeout 330 /tmp/$b/m3 bench $W > $OUT/compile-$b.log 2>&1; echo "compile $b exit $? ($(date +%T))"; } &
done
wait
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --profile --path mono"
timeout 60 /tmp/bin/m3 bench $P > $OUT/prof-fit.log 2>&1
rc=$?; echo "prof exit $rc"
[ $rc = 124 ] && { echo "the new build's mono profile did not finish in 60 s: stopping"; tail -3 $OUT/compile-bin.log; exit 1; }
grep -A22 "^mono ops" $OUT/prof-fit.log | cut -c1-140
M3_MONO_ROUTER_SPLIT=1 timeout 60 /tmp/bin/m3 bench $P > $OUT/prof-split.log 2>&1; echo "prof split exit $?"
grep -A22 "^mono ops" $OUT/prof-split.log | cut -c1-140
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for r in 1 2; do
  for b in bin old; do
    echo "=== $b round $r ($(date +%T))"
    timeout 90 /tmp/$b/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
  done
done > $OUT/ab.log 2>&1
cut -c1-160 $OUT/ab.log
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
