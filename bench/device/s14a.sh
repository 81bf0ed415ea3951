#!/usr/bin/env bash
# Session 14, call 1 (issue 12): each MoE layer's shared expert on a
# second stream beside the router and routed experts (Launcher::beside:
# a graph branch), with and without the main stream's launches at the
# highest priority, and the o projection's weights brought into L2 by
# bulk prefetches on the side stream while attention runs. One binary,
# variants by environment (M3_BESIDE, M3_L2_PREFETCH_MIB), interleaved in
# the same rounds. Correctness first under REQUIRE_GPU=1 (runner tests:
# mono bitwise the standard path; parity on the standard path). Logs to $OUT.
# (M3_BESIDE=prio was removed after this run: bench/NOTES.md session 14.)
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc REQUIRE_GPU=1
{
  echo "=== runner tests ($(date +%T))"
  timeout 220 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | tail -10
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts nvfp4 --dense mxfp8 --out $CK/small-nv --draft-layers 0 -q
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for m in small small-nv; do
    for p in standard mono; do
      echo "=== parity $m $p ($(date +%T))"
      timeout 60 /tmp/bin/m3 parity --model $CK/$m --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
    done
  done
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
unset REQUIRE_GPU
VARIANTS=${VARIANTS:-"off on prio on:24 on:48"}
{
  for r in $(seq 1 ${ROUNDS:-2}); do
    for v in $VARIANTS; do
      b=${v%%:*}; pf=0; [[ $v == *:* ]] && pf=${v#*:}
      echo "=== layers beside=$b prefetch=${pf}MiB round $r ($(date +%T))"
      M3_BESIDE=$b M3_L2_PREFETCH_MIB=$pf timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 60 --rounds 1 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/layers.log 2>&1
grep -E "===|exit|[0-9] / [0-9]" $OUT/layers.log | head -60
