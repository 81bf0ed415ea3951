#!/usr/bin/env bash
# Session 27 (issue 13), prepared, not run (no device was lent): the mono
# path's wide mode, the load-time crossover and the beside phases.
# check.log: the runner's mono-bitwise test (now with a 24-row wide
#    step) and the --path auto test (it prints the crossover it measured
#    on tiny), REQUIRE_GPU=1; then `m3 generate --path auto` on a `small`
#    checkpoint: its info line is the crossover the engine would use;
#    golden through the GPU with the free-running report on the mono path
#    (every decode step of the cases' greedy runs there).
# (s27b.sh times it.)
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== test runner mono_path / auto_path / wide_mono ($(date +%T))"
  REQUIRE_GPU=1 timeout 200 /tmp/bin/test-runner mono_path auto_path wide_mono --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|bitwise|standard/mono|FAIL" | tail -12
  mkdir -p /tmp/ck
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out /tmp/ck/small --draft-layers 0 -q
  echo "=== generate --path auto ($(date +%T))"
  timeout 120 /tmp/bin/m3 generate --model /tmp/ck/small --backend gpu --path auto --prompt "the mono path" \
    --max-tokens 16 2>&1 | grep -E "path auto|rror|warn" | tail -4
  echo "=== golden --backend gpu --path mono ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu --path mono 2>&1 \
    | grep -E "golden:|mono path|FAIL|fail|identical|divergence" | tail -24
  echo "=== end ($(date +%T))"
} > $OUT/check.log 2>&1
cat $OUT/check.log
