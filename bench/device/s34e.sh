#!/usr/bin/env bash
# Session 34 (issue 13), any card, ~330 s: s34a.sh (never run, removed)
# less m3_verify (which s34c.sh ran on this build's CUDA kernels: mono,
# with session 33's pipelined walks, bitwise the standard path's plain
# walks on five models):
# 1. the linears' bitwise test (the halved batch with mono's pipelined
#    walks, and the full batch pipelined, against the plain full batch;
#    K = 6144 and 6272) and the f64 reference, REQUIRE_GPU=1 -> unit.log;
# 2. the mono gate over 64 steps at b1 / b4 / b16 on m3.1 --layers 12
#    (bitwise, the product formats) and the table -> mono.log.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
{ timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 4 --batch 1,4,16 --iters 1 --rounds 1 --warmup 1 \
  --parity-steps 0 --path both > $OUT/compile.log 2>&1; echo "m3.1 compiled, exit $? ($(date +%T))"; } &
m3_unit 200 the_halved_batch_is_bitwise_the_full_one variants_match_an_f64_reference > $OUT/unit.log 2>&1
cat $OUT/unit.log
wait
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --parity-steps 64 \
  --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both > $OUT/mono.log 2>&1
echo "exit $?" >> $OUT/mono.log
grep -E "parity|^\| \[.*decode.*/|^exit|rror" $OUT/mono.log | tail -12
