#!/usr/bin/env bash
# Session 34 (issues 12, 13), an H200 (needs_h200: the max-autotune peer's
# compile does not fit the H100's 80 GB, session 33), ~450 s. s33c.sh
# (never run, removed) with m3's kernels compiled while the peer compiles
# (s33c.sh gave a cold m3 run 60 s: m3.1's kernels take ~150 s to
# compile): m3 on the bf16 model
# (m3.1 --layers 8, fp8 caches) at b1 warmed up in the background (its GPU
# work is a ceiling measurement at its start and one step at its end; the
# peer's timed rounds come after its ~230 s of compiling), the peer
# compiled with max-autotune + CUDA graph at b1, then m3 timed alone, 2
# rounds x 40 -> m3-bf16.json, peer.json, ratios.json / .md (PERF.md /
# issue 13: >= 1.6x); last, the peer's self-check (tiny preset, fp8
# caches as timed, compiled in the default mode as in session 32, 100 s),
# after the MX model's per-layer figure at b1 / b16 (the router's new form
# on the H200; 2 rounds) -> m3-mx.json.
# PEER_TIMEOUT (s, default 400) bounds the peer. BATCH (default 1) sets
# the batch of the first half (session 39 ran BATCH=16 TAIL=0
# PEER_TIMEOUT=420: 233 s on a warm H200); TAIL=0 stops after the ratios.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
BT=${BATCH:-1}
M="--backend gpu --preset m3.1 --layers 8 --weights bf16 --batch $BT --context 4096"
{ timeout 300 /tmp/bin/m3 bench $M --iters 1 --rounds 1 --warmup 1 > $OUT/m3-warm.log 2>&1; echo "m3 warm-up exit $? ($(date +%T))"; } &
timeout ${PEER_TIMEOUT:-400} python3 bench/peer/peer.py --preset m3.1 --layers 8 --batch $BT --context 4096 --cache fp8 \
  --compile max-autotune --iters 100 --rounds 2 --out $OUT/peer.json > $OUT/peer.log 2>&1
echo "peer exit $? ($(date +%T))"
wait
grep -E "failed|check|^\| $BT " $OUT/peer.log | tail -6
timeout 120 /tmp/bin/m3 bench $M --iters 40 --rounds 2 --out $OUT/m3-bf16.json > $OUT/m3-bf16.log 2>&1
echo "m3 exit $?"
grep -E "^\| .*decode" $OUT/m3-bf16.log | tail -2
python3 bench/peer/ratios.py --m3 $OUT/m3-bf16.json --peer $OUT/peer.json --out $OUT/ratios.json > $OUT/ratios.log 2>&1
cat $OUT/ratios.log
[ "${TAIL:-1}" = 1 ] || exit 0
echo "=== m3 MX model, per layer ($(date +%T))"
timeout 90 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,16 --context 4096 \
  --iters 40 --rounds 2 --path standard --out $OUT/m3-mx.json > $OUT/m3-mx.log 2>&1
echo "m3 mx exit $?"
grep -E "^\| .*decode.*/" $OUT/m3-mx.log | tail -4
echo "=== peer self-check ($(date +%T))"
timeout 100 python3 bench/peer/peer.py --check --device cuda --cache fp8 --compile default > $OUT/check.log 2>&1
tail -6 $OUT/check.log
