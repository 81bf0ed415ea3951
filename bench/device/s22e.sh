#!/usr/bin/env bash
# Session 22, issue 13: bench/proto/chain.py with the next big phase staged
# only across the attention chain (run 4's "windows" were every small phase:
# each big phase is followed by one), at 2 CTAs an SM.
set -u
cd bench/proto
echo "=== chain.py --minb 2"
timeout 120 python3 chain.py --minb 2 2>&1 | grep -v '^{"case"' | tee $OUT/chain.log
