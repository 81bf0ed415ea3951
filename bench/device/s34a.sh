#!/usr/bin/env bash
# Session 34 (issue 13), any card, ~250 s: the device checks of session 33's
# mono default (MONO_DEFAULTS: the E2M1 one-tile walks and MXFP4's one-row
# walk software-pipelined in the mono build only). Its timed gates compared
# mono against a standard path built with the same pipelined walks; here
# mono runs its default against the standard path's plain walks:
# 1. the linears' bitwise test (the halved batch with mono's pipelined
#    walks, and the full batch pipelined, against the plain full batch;
#    K = 6144 and 6272) and the f64 reference, REQUIRE_GPU=1 -> unit.log;
# 2. m3_verify (every runner test: mono bitwise the standard path; golden
#    through the GPU; parity small on both paths) -> verify.log;
# 3. the mono gate over 64 steps at b1 / b4 / b16 on m3.1 --layers 12
#    (bitwise, the product formats) and the table -> mono.log.
set -u
. bench/device/common.sh
m3_setup
m3_unit 200 the_halved_batch_is_bitwise_the_full_one variants_match_an_f64_reference > $OUT/unit.log 2>&1
cat $OUT/unit.log
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --parity-steps 64 \
  --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both > $OUT/mono.log 2>&1
echo "exit $?" >> $OUT/mono.log
grep -E "parity|^\| \[.*decode.*/|^exit|rror" $OUT/mono.log | tail -12
