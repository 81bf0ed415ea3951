#!/usr/bin/env bash
# Session 33 (issues 12, 13), an H200 (needs_h200: the max-autotune peer's
# compile does not fit the H100's 80 GB, session 33: inductor's autotuning
# asked for 8.8 GiB more with 74.9 GiB in use). m3 on the bf16 model (m3.1
# --layers 8, fp8 caches) at b1, then the peer compiled with max-autotune +
# CUDA graph at b1, in the same call -> m3-bf16.json, peer.json, ratios.md
# (PERF.md / issue 13: >= 1.6x). PEER_TIMEOUT (s, default 370) bounds the
# peer (session 8: ~230 s of compile at b1).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 60 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 8 --weights bf16 --batch 1 --context 4096 \
  --iters 40 --rounds 2 --out $OUT/m3-bf16.json > $OUT/m3-bf16.log 2>&1
grep -E "^\| .*decode" $OUT/m3-bf16.log | tail -2
timeout ${PEER_TIMEOUT:-370} python3 bench/peer/peer.py --preset m3.1 --layers 8 --batch 1 --context 4096 --cache fp8 \
  --compile max-autotune --iters 100 --rounds 2 --out $OUT/peer.json > $OUT/peer.log 2>&1
echo "peer exit $?"
grep -E "failed|^\| 1 " $OUT/peer.log
python3 bench/peer/ratios.py --m3 $OUT/m3-bf16.json --peer $OUT/peer.json --out $OUT/ratios.json > $OUT/ratios.log 2>&1
cat $OUT/ratios.log
