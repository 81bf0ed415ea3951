#!/usr/bin/env bash
# Session 22: bench/proto/chain.py with the grid barrier's arrive as one
# release reduction (edges alone, then the layer), and the layer with its
# four in-between small phases folded into the next phase's prologue (10
# phases instead of 14); then bench/proto/fp8mma.py --quick after its ctypes
# helpers moved to bench/proto/cudrv.py (the refactor's check).
set -u
cd bench/proto
for v in "--empty --arrive 1" "--arrive 1" "--fold"; do
  echo "=== chain.py $v"
  timeout 120 python3 chain.py $v 2>&1 | grep -v '^{"case"'
done 2>&1 | tee $OUT/chain.log
echo "=== fp8mma.py --quick" | tee $OUT/fp8mma.log
timeout 300 python3 fp8mma.py --quick 2>&1 | tail -30 | tee -a $OUT/fp8mma.log
