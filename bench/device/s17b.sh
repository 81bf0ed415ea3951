#!/usr/bin/env bash
# Session 17, call 3 (issue 12): where the b1 attention chain's time goes.
# Nsight Compute details (launch, occupancy, warp stall reasons, source
# counters) of the latency-bound launches of a b1 MoE layer at 4k:
# index scores, index top-k, attention partial and combine, head norm,
# router; caches and clocks left as they are (closer to the graph).
# Then (ab) interleaved processes, 2 rounds, per MoE layer at b1 / b4 / b16:
# attention variants (M3_ATTN_DEFINES: the merge's chunk loads all in
# flight, SC_UNROLL=64 against 16; the index-key rows into L2 before the
# scores' wait, SI_PF=1; the picked blocks' K / V rows into L2 from the
# top-k, SK_KV_PF=1; all three) and the side-stream o prefetch off
# (M3_L2_PREFETCH_MIB=0 against 16). SECTIONS picks parts (ncu ab).
# Logs to $OUT (ncu-att.txt.xz, ab.log).
# (Run 3. The attention variants and M3_ATTN_DEFINES were removed after it,
# none measured faster; those processes now run the defaults.)
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
want() { case " ${SECTIONS:-ncu ab} " in *" $1 "*) return 0 ;; esac; return 1; }
NCU=/usr/local/cuda/bin/ncu
K='regex:m3s_(index_scores|index_topk|attn_partial_split|attn_combine|headnorm_rope|router_small)$'
want ncu && timeout 300 $NCU --target-processes all -k "$K" --launch-skip 60 --launch-count 6 --cache-control none \
  --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section SourceCounters --print-units base \
  /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 2 --rounds 1 --warmup 0 --batch 1 \
  > $OUT/ncu-att.txt 2> $OUT/ncu-att.err
want ncu && { echo "ncu exit $? lines $(wc -l < $OUT/ncu-att.txt)"; tail -3 $OUT/ncu-att.err; }
want ncu && grep -E "m3s_|Duration|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|Block Limit|Waves Per SM|Grid Size|Issued Ipc" $OUT/ncu-att.txt | head -150
want ncu && xz -9 -f $OUT/ncu-att.txt
want ab && {
  for r in 1 2; do
    for v in "" "SC_UNROLL=64" "SI_PF=1" "SK_KV_PF=1" "SI_PF=1 SK_KV_PF=1 SC_UNROLL=64" "MIB0"; do
      echo "=== '$v' round $r ($(date +%T))"
      if [ "$v" = MIB0 ]; then e="M3_L2_PREFETCH_MIB=0"; else e="M3_ATTN_DEFINES=$v"; fi
      env "$e" timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 50 --rounds 1 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ab.log 2>&1
want ab && cat $OUT/ab.log
