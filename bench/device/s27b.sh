#!/usr/bin/env bash
# Session 27 (issue 13), prepared, not run: after s27a.sh (the checks).
# pair1.log / pair0.log: `m3 bench --path both` at batch 1-64 (32 and 64
# are the wide mode), the beside phases on (the default) and off
# (M3_MONO_PAIR=0): per case standard and mono medians from the same
# rounds, and the crossover line by the --path auto rule. ~400 s.
set -u
. bench/device/common.sh
m3_setup
for pair in 1 0; do
  M3_MONO_PAIR=$pair timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
    --batch 1,4,16,32,64 --context 4096 --iters 40 --rounds 2 --path both > $OUT/pair$pair.log 2>&1
  echo "exit $?" >> $OUT/pair$pair.log
  echo "=== M3_MONO_PAIR=$pair"
  grep -E "^\| decode|^crossover|per layer|^exit" $OUT/pair$pair.log | tail -24
done
