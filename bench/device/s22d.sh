#!/usr/bin/env bash
# Session 22, issue 13: bench/proto/chain.py: what one edge costs alone (14
# empty phases: a launch, a PDL launch, a grid barrier), and staging the
# next big phase only across the small phases (the attention chain).
set -u
cd bench/proto
for v in "--empty" "--empty --minb 4" "--minb 2"; do
  echo "=== chain.py $v"
  timeout 120 python3 chain.py $v 2>&1 | grep -v '^{"case"'
done 2>&1 | tee $OUT/chain.log
