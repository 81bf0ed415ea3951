#!/usr/bin/env bash
# Session 37 (issue 13), any card, ~520 s. The router's logits loop
# (s_linear_f32w) with every x load of a row issued before its first
# product and two rows a pass (new) against the build before it (old,
# .carry/old.tar.xz: HEAD 7363356), whose loads NVRTC 13.0 issued in
# groups of ~8 in the mono build (SASS, bench/NOTES.md session 37); the
# same bits. Both paths, b1 / b4 / b16, 2 rounds interleaved, each after
# a 16-step gate -> ab.log; then M3_MONO_ROTATE_LATE=1 (rot, session 36's
# prepared late-CTA rotation) and S_F32W_ROWS=1 (r1: one row a pass, the
# mono build only) on the new build in the same rounds; then the new
# build's b16 and b1 mono op profiles -> prof-new-b{16,1}.log (the
# router's `run`: 60.8 us a b16 layer, 16.1 at b1 in session 36). Ran at
# a75a8ea; the defaults are now rot + r1, so `new` would be both.
set -u
. bench/device/common.sh
m3_setup old
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
variant() {
  local v=$1 a=() x
  shift
  for x in "$@"; do [ "$x" = /tmp/bin/m3 ] && a+=(/tmp/old/m3) || a+=("$x"); done
  case $v in
    old) "${a[@]}" ;;
    new) "$@" ;;
    rot) env M3_MONO_ROTATE_LATE=1 "$@" ;;
    r1) env M3_MONO_DEFINES=S_F32W_ROWS=1 "$@" ;;
    *) echo "no variant $v" >&2; return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_variants 2 "$B" old new rot r1 > $OUT/ab.log 2>&1
grep -E "^===|compiled|^\| \[|differ|rror|failed" $OUT/ab.log | cut -c1-150
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --path mono --profile"
for b in 16 1; do
  timeout 60 /tmp/bin/m3 bench $P --batch $b > $OUT/prof-new-b$b.log 2>&1
  echo "=== profile new b$b (exit $?)"; grep -A20 "^mono ops" $OUT/prof-new-b$b.log | cut -c1-190
done
