#!/usr/bin/env bash
# Session 14, call 2 (issue 12): how much of the o projection to bring into
# L2 beside attention (M3_L2_PREFETCH_MIB), whether the MX weight streams
# marked evict-first in L2 (S_W_EVICT_FIRST=1, a small-step define) let
# prefetched weights outlive them, and the next layer's q weights brought
# into L2 beside the routed experts (M3_L2_PREFETCH_NEXT_MIB). One binary,
# variants by environment, interleaved in the same rounds; each variant
# is `O_MIB:NEXT_MIB:EF`. Logs to $OUT.
# (The switches this measured and rejected, S_W_EVICT_FIRST,
# M3_L2_PREFETCH_NEXT_MIB and M3_L2_PREFETCH_HINT, were removed after the
# runs: bench/NOTES.md session 14. M3_BESIDE=prio likewise, after s14a.)
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
VARIANTS=${VARIANTS:-"0:0:0 16:0:0 24:0:0 32:0:0 24:0:1 24:16:1 24:32:1 24:16:0"}
{
  for r in $(seq 1 ${ROUNDS:-2}); do
    for v in $VARIANTS; do
      IFS=: read -r o nx ef <<< "$v"
      defs="S_MMA_WARPS=4 S_MMA_MAXBT=2"; [[ $ef == 1 ]] && defs="$defs S_W_EVICT_FIRST=1"
      echo "=== layers o=${o}MiB next=${nx}MiB evict_first=$ef round $r ($(date +%T))"
      M3_BESIDE=on M3_L2_PREFETCH_MIB=$o M3_L2_PREFETCH_NEXT_MIB=$nx M3_SMALL_STEP_DEFINES="$defs" \
        timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 60 --rounds 1 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/layers.log 2>&1
grep -E "===|exit [^0]|[0-9] / [0-9]" $OUT/layers.log | sed 's/| decode \(b[0-9]*\) ctx4096 | [0-9.]* \/ [0-9.]* | \([0-9.]*\) .*/\1 \2/' | paste - - - - | head -40
