#!/usr/bin/env bash
# Session 18, call 4 (issue 12): the index scores' grid by rows (2048 CTAs
# a launch, at least 256 a row: 1025 a row at 1 row and 128k) against the
# old cap of 256 a row (M3_INDEX_GRID_X=256), 4k and 128k, 2 rounds; the
# runner test (standard vs CPU) under REQUIRE_GPU=1.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for e in "M3_NONE=1" "M3_INDEX_GRID_X=256"; do
      echo "=== $e round $r ($(date +%T))"
      env $e timeout 150 /tmp/bin/m3 bench $B --context 4096 --batch 1,4,16 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
      env $e timeout 150 /tmp/bin/m3 bench $B --context 131072 --batch 4 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/grid.log 2>&1
cat $OUT/grid.log
{
  echo "=== runner test (standard vs CPU), REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 150 /tmp/bin/test-runner --test-threads=1 --nocapture gpu_runner_matches 2>&1 | grep -E "^test result|panicked|FAIL" | tail -4
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
