#!/usr/bin/env bash
# Session 30 (issue 13), s30d.sh cut to what ~270 s of device time holds:
# the GPU runner tests under REQUIRE_GPU=1, issue 13's 4k table (batch 1,
# 2, 4, 8, 16 mono, 32, 64 wide; a 64-step parity gate, every step's
# tokens and logits bit for bit; 2 rounds), the op profile at b1 and b16
# with each op's critical path, then b1 at 4k and one sequence at 128k
# (8-step gate). The early start and spread on (defaults).
set -u
. bench/device/common.sh
m3_setup
echo "=== test runner, REQUIRE_GPU=1 ($(date +%T))"
REQUIRE_GPU=1 timeout 100 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | tail -16 | tee $OUT/runner.log
echo "=== 4k table ($(date +%T))"
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 2 --path both \
  --batch 1,2,4,8,16,32,64 --context 4096 --parity-steps 64 --out $OUT/mono4k.json > $OUT/mono4k.log 2>&1
echo "exit $?" >> $OUT/mono4k.log
grep -E "^device|^crossover|^mono parity|differ|^\| \[.*decode.*/|^exit|rror" $OUT/mono4k.log | tail -30
echo "=== profile ($(date +%T))"
timeout 30 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 \
  --batch 1,16 --path mono --profile > $OUT/prof.log 2>&1
grep -A19 "^mono ops" $OUT/prof.log
echo "=== 128k ($(date +%T))"
timeout 60 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 2 --path both \
  --batch 1 --context 4096 --long-context 131072 --parity-steps 8 --out $OUT/mono128k.json > $OUT/mono128k.log 2>&1
echo "exit $?" >> $OUT/mono128k.log
grep -E "^mono parity|differ|^\| \[.*decode.*/|^exit|rror" $OUT/mono128k.log | tail -12
