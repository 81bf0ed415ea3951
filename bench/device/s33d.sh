#!/usr/bin/env bash
# Session 33 (issue 12), after s33c.sh on the same warm H200 if the
# pipelined one-row walk won its microbench there: the MoE layer at b1 / b4
# / b16, the build against P (MXFP4 + NVFP4 one-row walks pipelined, 4 CTAs
# an SM), 2 rounds -> layer.log; then the microbench at 10 launches a
# replay, MXFP4 / NVFP4 one row -> m10.log.
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
P="$B S_H_PIPE_ONE=20 S_H_ONE_UMUL_NV=1 S_R1_MINB_FP4=4"
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --variants "$P" > $OUT/layer.log 2>&1
echo "exit $?" >> $OUT/layer.log
grep -E "^ceiling|^\| .*decode.*/|^exit" $OUT/layer.log | tail -14
timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4 \
  --kernel-rows 1 --kernel-reps 10 --kernel-formats mxfp4,nvfp4 --variants "$P" > $OUT/m10.log 2>&1
grep -E "^\|" $OUT/m10.log | grep -v default | cut -d'|' -f2,3,4,5,9,10
