#!/usr/bin/env bash
# Session 14, call 3 (issue 12): the o projection's L2 prefetch beside
# attention (joined before the o projection) against the same prefetch on
# a hint stream joined only at the step's end (M3_L2_PREFETCH_HINT=1), at
# 16-48 MiB, and the next layer's q weights prefetched on the hint stream
# beside the routed experts' down projection (M3_L2_PREFETCH_NEXT_MIB).
# Shared expert beside in every variant. One binary, variants by
# environment (`O_MIB:NEXT_MIB:HINT`), interleaved in the same rounds.
# Logs to $OUT.
# (The switches this measured and rejected, S_W_EVICT_FIRST,
# M3_L2_PREFETCH_NEXT_MIB and M3_L2_PREFETCH_HINT, were removed after the
# runs: bench/NOTES.md session 14. M3_BESIDE=prio likewise, after s14a.)
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
VARIANTS=${VARIANTS:-"16:0:0 16:0:1 32:0:1 48:0:1 16:16:1 16:16:0 0:16:0 16:32:0"}
{
  for r in $(seq 1 ${ROUNDS:-2}); do
    for v in $VARIANTS; do
      IFS=: read -r o nx hint <<< "$v"
      echo "=== layers o=${o}MiB next=${nx}MiB hint=$hint round $r ($(date +%T))"
      M3_BESIDE=on M3_L2_PREFETCH_MIB=$o M3_L2_PREFETCH_NEXT_MIB=$nx M3_L2_PREFETCH_HINT=$hint \
        timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 60 --rounds 1 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/layers.log 2>&1
grep -E "===|exit [^0]|[0-9] / [0-9]" $OUT/layers.log | sed 's/| decode \(b[0-9]*\) ctx4096 | [0-9.]* \/ [0-9.]* | \([0-9.]*\) .*/\1 \2/' | paste - - - - | head -40
