#!/usr/bin/env bash
# Session 22: bench/proto/chain.py --window: one big phase (o, 50 MB) after
# a 13.5 us small phase, with 0-96 KB a CTA of it staged into L2 or shared
# memory during the window: does staging shorten the phase at all (runs 2-6
# found every staging slower)?
set -u
cd bench/proto
for v in "--window" "--window --minb 2 --u 16"; do
  echo "=== chain.py $v"
  timeout 120 python3 chain.py $v 2>&1 | grep -v '^{"case"'
done 2>&1 | tee $OUT/chain.log
