#!/usr/bin/env bash
# Prepared in session 14, not yet run (issue 12): the checks that must pass
# before PathOptions::small_step_max_rows defaults to 64 (session 14 run 4:
# steps of 32 / 64 rows 2.5x / 2.1x faster on the small-step shape).
# The CLI reads M3_SMALL_STEP_MAX_ROWS; the runner test
# gpu_runner_matches_the_cpu_runner_case_by_case also runs its first case
# with the option at 90 rows (run first here, under REQUIRE_GPU=1).
# Golden through the GPU and parity (prompts prefilled in one step of up
# to 64 rows) with it at 64, then the crossover: steps of 16-256 rows with
# it at 16, 64 and 256. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
{
  echo "=== runner tests, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 240 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | tail -12
  echo "=== golden --backend gpu, small-step shape to 64 rows ($(date +%T))"
  M3_SMALL_STEP_MAX_ROWS=64 REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -E "golden:|FAIL|fail" | tail -8
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for n in 16 64; do
    echo "=== parity small, small-step shape to $n rows ($(date +%T))"
    M3_SMALL_STEP_MAX_ROWS=$n REQUIRE_GPU=1 timeout 60 /tmp/bin/m3 parity --model $CK/small --reference cpu --backend gpu --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
  done
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
for n in 16 64 256; do
  echo "=== small-step shape to $n rows"
  M3_SMALL_STEP_MAX_ROWS=$n timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 16,32,64,128,256 \
    --context 4096 --iters 10 --rounds 1 2>&1 | grep -E "^\| decode|rror"
done > $OUT/crossover.log 2>&1
cat $OUT/crossover.log
# Where a b1 MoE layer's time goes (direct launches, a gap after each).
timeout 90 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 1 --context 4096 \
  --iters 3 --rounds 1 --profile 2>&1 | grep -A40 "^profile" > $OUT/profile-b1.log
head -40 $OUT/profile-b1.log
