#!/usr/bin/env bash
# Prepared in session 47 (issues 12, 13): the first call of the next
# session, whichever card comes. On an H200: the figures of record with
# sessions 45-47's defaults (s40a.sh: the kernel microbench, GATE=0; then
# s45c.sh: the per-layer table at batch 1-64 and the grouped MXFP4 at 16
# rows), ~300 s. On an H100: s48a.sh (where the small-step build stops
# paying, 1024 / 2048 rows), ~250 s. Cold start aside.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
case "$card" in
  *H200*) GATE=0 bash bench/device/s40a.sh; bash bench/device/s45c.sh ;;
  *) bash bench/device/s48a.sh ;;
esac
