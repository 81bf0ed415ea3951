#!/usr/bin/env bash
# Session 28 (issue 13): s28e.sh's parity gate found mono and standard
# different at b4 and b16 on the bench model (every logit of every row,
# from the first step; b1 bitwise). Which side and which part: the gate's
# four chains (standard graphs = reference, standard direct launches,
# mono graphs, mono direct) at b1 / b2 / b4 / b16, 2 steps each, on
# m3.1 --layers 4 with the standard path's side stream off and with
# mono's beside phases off, and on the small preset. parity.log.
set -u
. bench/device/common.sh
m3_setup
run() {
  echo "=== $* ($(date +%T))"
  # shellcheck disable=SC2068
  timeout 120 env $@ 2>&1 | grep -E "^  decode|rror|^mono path" | head -24
}
A="--backend gpu --layers 4 --batch 1,2,4,16 --context 4096 --iters 1 --rounds 1 --warmup 1 --path both --parity-steps 2 --out /tmp/p.json"
{
  run M3_NONE=1 /tmp/bin/m3 bench --preset m3.1 $A
  run M3_BESIDE=0 /tmp/bin/m3 bench --preset m3.1 $A
  run M3_MONO_PAIR=0 /tmp/bin/m3 bench --preset m3.1 $A
  run M3_NONE=1 /tmp/bin/m3 bench --preset small $A
} > $OUT/parity.log 2>&1
cat $OUT/parity.log
