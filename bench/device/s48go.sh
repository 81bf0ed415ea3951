#!/usr/bin/env bash
# Prepared in session 47 (issues 12, 13): the first call of the next
# session, whichever card comes. On an H200: the figures of record with
# sessions 45-47's defaults (s40a.sh: the kernel microbench, GATE=0; then
# s45c.sh: the per-layer table at batch 1-64 and the grouped MXFP4 at 16
# rows), ~300 s. On an H100: s48a.sh (where the small-step build stops
# paying, 1024 / 2048 rows), ~250 s. Cold start aside. First, the device
# check of the chunked records' own stride (commit 0ea61ff, simulator
# only until then): the runner's chunked-route, wide-mono and
# GPU-against-CPU tests and golden through the GPU (check.log, ~120 s
# warm; a cold card ran the runner suite 1.5x slower in session 47).
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== runner: chunked routes, wide mono, GPU vs CPU ($(date +%T))"
  REQUIRE_GPU=1 timeout 300 /tmp/bin/test-runner chunked_routes wide_mono gpu_runner_matches --test-threads=1 \
    --nocapture 2>&1 | grep -E "^test |^test result|panicked|bitwise|FAIL" | tail -12
  echo "=== golden --backend gpu ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 200 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 \
    | grep -E "golden:|FAIL|fail" | tail -4
  m3_cache_report
} > "$OUT/check.log" 2>&1
cat "$OUT/check.log"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
case "$card" in
  *H200*) bash bench/device/s45c.sh; GATE=0 bash bench/device/s40a.sh ;;
  *) bash bench/device/s48a.sh ;;
esac
m3_cache_report
