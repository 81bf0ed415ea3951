#!/usr/bin/env bash
# Session 17, call 4 (issue 12): why does M3_L2_PREFETCH_MIB=0 cost ~3% a
# MoE layer when leaving out the prefetch launch itself (M3_SKIP_LAUNCHES)
# costs nothing? The fork / join around the attention chain makes the o
# projection's edge a full one instead of PDL. Test: the MX linears
# launched without PDL (M3_NO_PDL_LAUNCHES: all, MXFP8 only, MXFP4 only)
# against the defaults, MIB=0 and the skipped prefetch; interleaved
# processes, 2 rounds, per MoE layer at b1 / b4 / b16. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
E8="m3s_mma_e4m3,m3s_mma_e4m3_r1,m3s_mma_e4m3_r8"
F4="m3s_mma_fp4,m3s_mma_fp4_r1,m3s_mma_fp4_r8"
{
  for r in 1 2; do
    for e in "M3_NONE=1" "M3_L2_PREFETCH_MIB=0" "M3_SKIP_LAUNCHES=l2_prefetch" "M3_NO_PDL_LAUNCHES=$E8,$F4" \
      "M3_NO_PDL_LAUNCHES=$E8" "M3_NO_PDL_LAUNCHES=$F4"; do
      echo "=== '$e' round $r ($(date +%T))"
      env "$e" timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 50 --rounds 1 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/nopdl.log 2>&1
cat $OUT/nopdl.log
