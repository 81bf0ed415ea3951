#!/usr/bin/env bash
# Session 31 (issue 13), any card. The op calls' register saves: a CTA
# with no block of an op skips its call (S_MONO_SKIP=1, the new default),
# and the shared-memory carve-out cut to what the CTAs need so L1 holds
# their stacks (M3_MONO_CARVEOUT=fit, the new default; max = 228 KB of
# shared memory, 28 KB of L1, session 30's). In the order of what matters
# if the call is cut short:
# 1. A/B, interleaved, 2 rounds, `m3 bench --path both` on m3.1 --layers
#    12 --per-layer 6 at b1 / b4 / b16, each after a 16-step parity gate ->
#    ab.log (the fit variants are left out if the default build hangs on
#    the tiny model: the carve-out would then hold fewer CTAs);
# 2. the GPU runner tests under REQUIRE_GPU=1 (new defaults) -> runner.log;
# 3. the op profile at b1 and b16 -> prof.log;
# 4. issue 13's table at 4k, b1-64, 64-step gate, 2 rounds -> mono4k.*;
# 5. b1 at 4k and 128k, 8-step gate -> mono128k.*.
set -u
. bench/device/common.sh
m3_setup
echo "=== compile ($(date +%T))"
M3_MONO_DEFINES="S_MONO_SKIP=0" M3_MONO_CARVEOUT=max timeout 150 /tmp/bin/m3 bench --backend gpu --preset tiny --batch 1 \
  --iters 1 --rounds 1 --warmup 1 --path mono --parity-steps 0 > $OUT/c0.log 2>&1 &
timeout 150 /tmp/bin/m3 bench --backend gpu --preset tiny --batch 1 --iters 1 --rounds 1 --warmup 1 --path both \
  --parity-steps 2 > $OUT/c1.log 2>&1
rc=$?
wait
echo "compiled ($(date +%T)); default build on tiny: exit $rc"
grep -E "^mono path|rror" $OUT/c1.log | head -3
V=("M3_MONO_DEFINES=S_MONO_SKIP=0 M3_MONO_CARVEOUT=max" "M3_MONO_CARVEOUT=max" "M3_MONO_DEFINES=S_MONO_SKIP=0" "M3_MONO_CARVEOUT=fit")
[ $rc -eq 0 ] || V=("M3_MONO_DEFINES=S_MONO_SKIP=0 M3_MONO_CARVEOUT=max" "M3_MONO_CARVEOUT=max")
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for r in 1 2; do
  for v in "${V[@]}"; do
    echo "=== $v round $r ($(date +%T))"
    env $v timeout 60 /tmp/bin/m3 bench $B 2>&1 | grep -E "^mono path|^\| \[.*decode.*/|^mono parity|differ|rror"
  done
done > $OUT/ab.log 2>&1
grep -E "^===|mono\]|differ|rror" $OUT/ab.log
echo "=== test runner, REQUIRE_GPU=1 ($(date +%T))"
REQUIRE_GPU=1 timeout 100 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | tail -16 > $OUT/runner.log
tail -3 $OUT/runner.log
echo "=== profile ($(date +%T))"
timeout 40 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 \
  --batch 1,16 --path mono --profile > $OUT/prof.log 2>&1
grep -A19 "^mono ops" $OUT/prof.log | cut -c1-140
echo "=== 4k table ($(date +%T))"
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 2 --path both \
  --batch 1,2,4,8,16,32,64 --context 4096 --parity-steps 64 --out $OUT/mono4k.json > $OUT/mono4k.log 2>&1
echo "exit $?" >> $OUT/mono4k.log
grep -E "^crossover|^mono parity|differ|^\| \[.*decode.*/|^exit|rror" $OUT/mono4k.log | tail -30
echo "=== 128k ($(date +%T))"
timeout 60 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 2 --path both \
  --batch 1 --context 4096 --long-context 131072 --parity-steps 8 --out $OUT/mono128k.json > $OUT/mono128k.log 2>&1
echo "exit $?" >> $OUT/mono128k.log
grep -E "^mono parity|differ|^\| \[.*decode.*/|^exit|rror" $OUT/mono128k.log | tail -12
echo "=== done ($(date +%T))"
