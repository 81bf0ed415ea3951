#!/usr/bin/env bash
# Session 35 (issue 13), any card, ~450 s. Session 34's prepared
# S_MONO_INLINE_ROUTER (the fused router inlined into the interpreter:
# no call saves, but spills in the interpreter itself) and
# S_ROUTER_RELEASE (the router's count of finished CTAs a release add and
# one acquire in the last CTA, instead of __threadfence's MEMBAR.SC and L1
# invalidation in every CTA) against the default, and where the router's
# ~20 us of a b1 mono layer now goes:
# 1. the default build compiled, then the two variants at once (m3.1
#    --layers 4, 1 / 4 / 16 rows, both paths) -> compile-*.log;
# 2. op profiles at b1, mono, each build -> prof-*.log;
# 3. interleaved A/B, 2 rounds, m3.1 --layers 12 --per-layer 6, b1 / b4 /
#    b16, --path both, each after a 16-step gate -> ab.log;
# 4. Nsight Compute on one b1 mono layer of the default build (as s31a.sh)
#    -> mono1.txt, mono1-sass.csv.xz (read with bench/tools/sass_profile.py:
#    each function's own stall reasons).
# (Both ran neutral and were removed from the code in session 35: the
# define whitelist now refuses them, so this script does not run again.)
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
W="--backend gpu --preset m3.1 --layers 4 --batch 1,4,16 --iters 1 --rounds 1 --warmup 1 --parity-steps 0 --path both"
defs() { case $1 in base) echo "" ;; inline) echo "S_MONO_INLINE_ROUTER=1" ;; release) echo "S_ROUTER_RELEASE=1" ;; esac; }
# the default build first (the standard kernels the three share), then
# the two variants' mono units at once (session 34: three cold processes
# at once did not finish in 200 s)
timeout 300 /tmp/bin/m3 bench $W > $OUT/compile-base.log 2>&1; echo "compile base exit $? ($(date +%T))"
for v in inline release; do
  { M3_MONO_DEFINES="$(defs $v)" timeout 200 /tmp/bin/m3 bench $W > $OUT/compile-$v.log 2>&1; echo "compile $v exit $? ($(date +%T))"; } &
done
wait
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --profile --path mono"
for v in base inline release; do
  M3_MONO_DEFINES="$(defs $v)" timeout 60 /tmp/bin/m3 bench $P > $OUT/prof-$v.log 2>&1
  echo "=== $v (exit $?)"; grep -A20 "^mono ops" $OUT/prof-$v.log | cut -c1-140
done
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for r in 1 2; do
  for v in base inline release; do
    echo "=== $v round $r ($(date +%T))"
    M3_MONO_DEFINES="$(defs $v)" timeout 90 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
  done
done > $OUT/ab.log 2>&1
cut -c1-160 $OUT/ab.log
m3_ncu_mono
