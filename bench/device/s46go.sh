#!/usr/bin/env bash
# Session 46 (issues 12, 13): the first call of the session, whichever
# card comes. On an H200: the figures of record with the session-45
# default (s40a.sh: the kernel microbench and golden; GATE=0 here, the
# per-layer table follows) and s45c.sh's per-layer table at batch 1-64.
# On an H100: the prepared A/Bs s46d.sh (chunk-minor plain launches) and
# s46c.sh (the routed PDL edges). ~300 s a card, cold start aside.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
case "$card" in
  *H200*) GATE=0 bash bench/device/s40a.sh; bash bench/device/s45c.sh ;;
  *) bash bench/device/s46d.sh; bash bench/device/s46c.sh ;;
esac
