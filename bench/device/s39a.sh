#!/usr/bin/env bash
# Session 39 (issue 12), an H200, ~300 s: s34d.sh's first half at batch 16
# (BATCH, default 16): m3 on the bf16 model (m3.1 --layers 8, fp8 caches)
# warmed up while the peer compiles with max-autotune + CUDA graph, then m3
# timed alone, 2 rounds x 40 -> m3-bf16.json, peer.json, ratios.json.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
BT=${BATCH:-16}
M="--backend gpu --preset m3.1 --layers 8 --weights bf16 --batch $BT --context 4096"
{ timeout 300 /tmp/bin/m3 bench $M --iters 1 --rounds 1 --warmup 1 > $OUT/m3-warm.log 2>&1; echo "m3 warm-up exit $? ($(date +%T))"; } &
timeout ${PEER_TIMEOUT:-420} python3 bench/peer/peer.py --preset m3.1 --layers 8 --batch $BT --context 4096 --cache fp8 \
  --compile max-autotune --iters 100 --rounds 2 --out $OUT/peer.json > $OUT/peer.log 2>&1
echo "peer exit $? ($(date +%T))"
wait
grep -E "failed|check|^\| $BT " $OUT/peer.log | tail -6
timeout 120 /tmp/bin/m3 bench $M --iters 40 --rounds 2 --out $OUT/m3-bf16.json > $OUT/m3-bf16.log 2>&1
echo "m3 exit $?"
grep -E "^\| .*decode" $OUT/m3-bf16.log | tail -2
python3 bench/peer/ratios.py --m3 $OUT/m3-bf16.json --peer $OUT/peer.json --out $OUT/ratios.json > $OUT/ratios.log 2>&1
cat $OUT/ratios.log
