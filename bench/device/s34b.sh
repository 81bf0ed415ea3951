#!/usr/bin/env bash
# Session 34 (issues 12, 13), any card, ~200 s. Where the router's time
# goes, and the router with its arrays sized to the model's experts
# (S_ROUTER_FIT, new default 1; the same bits). The router is the longest
# op of a mono layer (H200 session 32: 34.8 us a b1 layer for 3 MB of f32
# weights and a top-4) and 16 us a launch on the standard path (direct
# launches). /tmp/old is the build before the change (S_ROUTER_FIT absent:
# the form of 0).
# 1. op profiles at b1, mono: fit (new default), fit=0, and the router as
#    three ops (M3_MONO_ROUTER_SPLIT=1: its parts apart) -> prof-*.log;
#    the standard path's direct-launch profile, new and old -> prof-std*.log;
# 2. interleaved A/B, 2 rounds, m3.1 --layers 12 --per-layer 6, b1/b4/b16,
#    --path both, each after a 16-step gate: new, new with the mono build's
#    S_ROUTER_FIT=0 (the standard path's router is fit in both), old
#    -> ab.log.
set -u
. bench/device/common.sh
m3_setup old
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --profile"
timeout 200 /tmp/bin/m3 bench $P --path mono > $OUT/prof-fit.log 2>&1 &
M3_MONO_DEFINES="S_ROUTER_FIT=0" timeout 200 /tmp/bin/m3 bench $P --path mono > $OUT/prof-fit0.log 2>&1 &
M3_MONO_ROUTER_SPLIT=1 timeout 200 /tmp/bin/m3 bench $P --path mono > $OUT/prof-split.log 2>&1 &
wait
echo "profiles compiled ($(date +%T))"
for v in fit fit0 split; do
  case $v in
    fit) e=() ;; fit0) e=(M3_MONO_DEFINES="S_ROUTER_FIT=0") ;; split) e=(M3_MONO_ROUTER_SPLIT=1) ;;
  esac
  env "${e[@]}" timeout 60 /tmp/bin/m3 bench $P --path mono > $OUT/prof-$v.log 2>&1
  echo "=== $v"; grep -A22 "^mono ops" $OUT/prof-$v.log | cut -c1-140
done
for b in bin old; do
  timeout 90 /tmp/$b/m3 bench $P --path standard > $OUT/prof-std-$b.log 2>&1
  echo "=== standard $b"; grep -E "router|^profile" $OUT/prof-std-$b.log
done
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
variant() {
  local v=$1
  shift
  case $v in
    new) "$@" ;;
    fit0) M3_MONO_DEFINES="S_ROUTER_FIT=0" "$@" ;;
    old) set -- "${@:1:2}" /tmp/old/m3 "${@:4}"; "$@" ;;
    *) return 1 ;;
  esac
}
m3_variants 2 "$B" new fit0 old > $OUT/ab.log 2>&1
grep -E "^===|compiled|\]|differ|rror" $OUT/ab.log | cut -c1-160
