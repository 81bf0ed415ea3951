#!/usr/bin/env bash
# Session 46 (issues 12, 13): the first call of the session, whichever
# card comes. On an H200: the figures of record with the session-45
# default (s40a.sh: the kernel microbench and golden; GATE=0 here, the
# per-layer table follows) and s45c.sh's per-layer table at batch 1-64.
# On an H100 this ran s46d.sh and s46c.sh in session 46 (run 1); since
# chunk-minor became the default there it runs s46e.sh's device check
# (AB=0) and s46g.sh (the routed launches' empty z-blocks); s46f.sh
# (chunk-minor at prefill sizes) in a call of its own. ~300 s on an H200,
# ~450 s on an H100, cold start aside.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
case "$card" in
  *H200*) GATE=0 bash bench/device/s40a.sh; bash bench/device/s45c.sh ;;
  *) AB=0 bash bench/device/s46e.sh; bash bench/device/s46g.sh ;;
esac
