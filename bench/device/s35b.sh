#!/usr/bin/env bash
# Session 35 (issue 13), any card, ~520 s. Two same-bits changes to mono
# (measured slower; the code is bench/results/2026-12-06-s35/
# next_l2_side_lag.patch, not in the tree):
# A. S_MONO_NEXT_L2 (mono_prelude.h,
# mono.cu, standard_decode.cu): a plain linear's sub-block whose next
# virtual block falls in a last round at most half full (b1 q|k|v: 616
# tiles on 528 sub-blocks, 88 in the second round) asks L2 for that
# block's weights while it streams its own. Session 35's b1 mono profile
# had q|k|v at 36.1 us a layer for 62.4 MB (1.83x its time at the in-run
# ceiling; o, one round, 1.57x): the second round looks as slow as the
# first, each sub-block at its own in-flight limit.
# B. M3_MONO_SIDE_LAG=1 (host side: the shared expert's chain one phase
# late): the router alone, then shared gate + up beside the routed gate +
# up, the SwiGLUs together, the downs together. In the profile the phase
# {shared gate + up, router} took 41.9 us, the router ending 20 us after
# the shared gate + up (by the deal, 72 CTAs are free for its 128 blocks;
# the rest wait for the shared gate + up's).
# 1. base, next, lag, both compiled (m3_variants: base alone first), interleaved,
#    2 rounds, m3.1 --layers 12 --per-layer 6, b1 / b4 / b16, --path both,
#    each after a 16-step gate -> ab.log;
# 2. op profiles at b1, mono, each -> prof-*.log;
# 3. the runner's mono tests under REQUIRE_GPU=1 with both (bitwise the
#    standard path on five models) -> runner-next.log.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
variant() {
  local v=$1
  shift
  case $v in
    base) "$@" ;;
    next) M3_MONO_DEFINES="S_MONO_NEXT_L2=1" "$@" ;;
    lag) M3_MONO_SIDE_LAG=1 "$@" ;;
    both) M3_MONO_DEFINES="S_MONO_NEXT_L2=1" M3_MONO_SIDE_LAG=1 "$@" ;;
    *) echo "no variant $v" >&2; return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_variants 2 "$B" base next lag both > $OUT/ab.log 2>&1
grep -E "^===|compiled|\]|differ|rror|failed" $OUT/ab.log | cut -c1-150
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --path mono --profile"
for v in base next lag; do
  variant $v timeout 60 /tmp/bin/m3 bench $P > $OUT/prof-$v.log 2>&1
  echo "=== profile $v (exit $?)"; grep -A20 "^mono ops" $OUT/prof-$v.log | cut -c1-140
done
echo "=== runner mono tests, both, REQUIRE_GPU=1 ($(date +%T))"
REQUIRE_GPU=1 M3_MONO_DEFINES="S_MONO_NEXT_L2=1" M3_MONO_SIDE_LAG=1 timeout 150 /tmp/bin/test-runner mono --test-threads=1 --nocapture > $OUT/runner-next.log 2>&1
echo "exit $?"
grep -E "^test |^test result|panicked|bitwise|FAIL" $OUT/runner-next.log | tail -16
