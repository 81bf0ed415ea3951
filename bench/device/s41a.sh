#!/usr/bin/env bash
# Session 41 (issue 12), any card (an H200 wanted), ~150 s cold.
# 1. bench/proto/pipes.py: thread-instructions a clock an SM of F2FP
#    (cvt e4m3x2 -> f16x2), LOP3, SHF, PRMT, IADD3, FFMA, HFMA2 and of two
#    E2M1 decodes (the engine's, by F2FP; one by logic alone), and the SASS
#    counts of each case (pipes.log);
# 2. the one-row walks (each variant against the defaults in the same run,
#    the tall launch 1 x [49152, 6144] and grouped experts 4 of 128, one
#    row; tall.log):
#    - S_W_PF_L1 (a format bitmask): the weights of the batch 1 (2) ahead
#      prefetched into L1 behind each batch's loads, so a warp keeps bytes
#      in flight while it decodes (no registers: no spill in the loops);
#    - S_X_JIT (removed after this run: negative, bench/NOTES.md session
#      41): x loaded block by block, and MXFP4 at 7 CTAs an SM in the
#      registers that frees (72, no spill in its loops, NVRTC 13.0), with
#      and without the prefetch; MXFP8 at 5.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "=== pipes ($(date +%T))"
timeout 60 python3 bench/proto/pipes.py --dump-cubin /tmp/pipes.cubin > $OUT/pipes.log 2>&1
echo "exit $?"
/usr/local/cuda/bin/cuobjdump -sass /tmp/pipes.cubin 2>/dev/null | awk '/Function :/ {f=$3} /\/\*[0-9a-f]{4}\*\// {for(i=1;i<=NF;i++) if ($i ~ /^[A-Z][A-Z0-9]+(\.[A-Z0-9_]+)*$/) {split($i,a,"."); c[f" "a[1]]++; break}} END {for (k in c) if (c[k] > 8) print k, c[k]}' | sort >> $OUT/pipes.log
cat $OUT/pipes.log
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
echo "=== tall + variants ($(date +%T))"
timeout 400 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x49152 \
  --kernel-experts 4 --kernel-rows 1 --kernel-formats mxfp4,nvfp4,mxfp8 \
  --variants "$D S_W_PF_L1=22;$D S_W_PF_L1=22 S_W_PF_DIST=2;$D S_X_JIT=4 S_R1_MINB_FP4=7;$D S_W_PF_L1=4 S_X_JIT=4 S_R1_MINB_FP4=7;$D S_X_JIT=2 S_R1_MINB_FP8=5" > $OUT/tall.log 2>&1
echo "exit $?"
grep -E "x/row|rror|^ceiling" $OUT/tall.log | cut -c1-160
