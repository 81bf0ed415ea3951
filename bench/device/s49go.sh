#!/usr/bin/env bash
# Prepared in session 48 (issues 12, 13): the first call of the next
# session, whichever card comes (with the seeded kernel cache a cold card
# compiles only the variants). On an H200: s45c.sh (the per-layer table
# b1-64 and grouped MXFP4 at 16 rows: the figures of record with sessions
# 45-48's defaults, ~60 s warm), s49a.sh (the 2048-row bound, the first
# time on the H200), then s40a.sh (GATE=0: the kernel microbench). On an
# H100: s49a.sh (the bound in the committed code), then the runner suite
# and golden (m3_verify's first half). Keep the call under ~450 s.
set -u
. bench/device/common.sh
m3_setup
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
case "$card" in
  *H200*) bash bench/device/s45c.sh; bash bench/device/s49a.sh; GATE=0 bash bench/device/s40a.sh ;;
  *)
    bash bench/device/s49a.sh
    REQUIRE_GPU=1 timeout 200 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" \
      | tail -16 > "$OUT/runner.log"
    REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 150 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 \
      | grep -E "golden:|FAIL|fail" | tail -4 >> "$OUT/runner.log"
    cat "$OUT/runner.log"
    ;;
esac
m3_cache_report
