#!/usr/bin/env bash
# Session 47 (issues 12, 13), any card, ~420 s cold: the device check of
# the session-47 defaults (route records of at most a CTA's rows,
# chunk-minor plain launches up to 512 rows): the linears' bitwise unit
# test (now 128 rows too), m3_verify (runner, backend_ops, golden, parity
# small std + mono); then the route records at prefill-sized steps
# (b128 / b256 / b512 small-step, CTA 16 rows; b1024 the 8-warp build,
# CTA 64 rows; context 512), M3_ROUTE_CHUNK=0 against the default,
# 1 round (route-big.log). The unit test's limit is 420 s: on session
# 47's cold H100 it ran past 300 s (35 s warm); the whole script then
# needs more than one 600-s call cold.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
m3_unit 420 the_halved_batch > "$OUT/unit.log" 2>&1; cat "$OUT/unit.log"
m3_verify > "$OUT/verify.log" 2>&1; cat "$OUT/verify.log"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 128,256,512,1024 --context 512 --iters 8 --warmup 2 --rounds 1 --path standard"
m3_env_ab M3_ROUTE_CHUNK 1 "$B" base= off=0 > "$OUT/route-big.log" 2>&1
grep -E "^===|^\| decode|rror" "$OUT/route-big.log" | cut -c1-150
