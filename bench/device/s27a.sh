#!/usr/bin/env bash
# Session 27 (issue 13), prepared, not run (no device was lent): the mono
# path's wide mode, the load-time crossover and the beside phases.
# 1. check.log: the runner's mono-bitwise test (now with a 24-row wide
#    step) and the --path auto test (it prints the crossover it measured
#    on tiny), REQUIRE_GPU=1; then `m3 generate --path auto` on a `small`
#    checkpoint: its info line is the crossover the engine would use.
# 2. pair1.log / pair0.log: `m3 bench --path both` at batch 1-64 (32 and
#    64 are the wide mode), the beside phases on (the default) and off
#    (M3_MONO_PAIR=0): per case standard and mono medians from the same
#    rounds, and the crossover line by the --path auto rule.
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== test runner mono_path / auto_path ($(date +%T))"
  REQUIRE_GPU=1 timeout 200 /tmp/bin/test-runner mono_path auto_path --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|bitwise|standard/mono|FAIL" | tail -12
  mkdir -p /tmp/ck
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out /tmp/ck/small --draft-layers 0 -q
  echo "=== generate --path auto ($(date +%T))"
  timeout 120 /tmp/bin/m3 generate --model /tmp/ck/small --backend gpu --path auto --prompt "the mono path" \
    --max-tokens 16 2>&1 | grep -E "path auto|rror|warn" | tail -4
  echo "=== end ($(date +%T))"
} > $OUT/check.log 2>&1
cat $OUT/check.log
for pair in 1 0; do
  M3_MONO_PAIR=$pair timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
    --batch 1,4,16,32,64 --context 4096 --iters 40 --rounds 2 --path both > $OUT/pair$pair.log 2>&1
  echo "exit $?" >> $OUT/pair$pair.log
  echo "=== M3_MONO_PAIR=$pair"
  grep -E "^\| decode|^crossover|per layer|^exit" $OUT/pair$pair.log | tail -24
done
