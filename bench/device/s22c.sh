#!/usr/bin/env bash
# Session 22, issue 13: bench/proto/chain.py's variants: persistent CTAs an
# SM (2, 4), loads in flight a thread (8, 16), a back-off in the grid
# barrier's poll, and work stealing for the big phases.
set -u
cd bench/proto
for v in "--minb 2" "--minb 2 --poll-ns 64" "--minb 4" "--minb 2 --u 16" "--minb 4 --poll-ns 64"; do
  echo "=== chain.py $v"
  timeout 120 python3 chain.py $v 2>&1 | grep -v '^{"case"'
done 2>&1 | tee $OUT/chain.log
