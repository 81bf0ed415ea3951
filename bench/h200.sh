#!/usr/bin/env bash
# Issue 12 item 4: m3 against the compiled PyTorch peer in ONE device call
# (prepared in session 7, not yet run). Run from the repository root on the
# H200 with the release binaries packed in .carry/bin.tar.xz
# (bench/device/pack.sh). Writes under $OUT: gate.log, m3-mx.json (the
# product formats, per layer), m3-bf16.json and peer.json (the like-for-like
# bf16 model, fp8 caches, m3.1 --layers 8), ratios.json / ratios.md (peer /
# m3 per batch and mode, PERF.md's 1.6x bar). COMPILE=default halves the
# compile time (max-autotune: minutes); CHECK_COMPILE sets the self-check's
# mode apart; PEER_TIMEOUT (s) bounds the timed peer.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
C=${COMPILE:-max-autotune}
B=${BATCH:-1,16}
# PART=m3: the gate and both m3 runs only; PART=peer: the peer only (two
# device calls when max-autotune's compile would not fit one; ratios.py
# then runs wherever both JSON files are)
P=${PART:-all}
if [ "$P" != peer ]; then
{
  echo "=== golden --backend gpu"
  M3_BIN=$M3 M3_ROOT=$PWD timeout 150 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -E "golden:|FAIL" | tail -4
  echo "exit ${PIPESTATUS[0]}"
  echo "=== peer self-check (fp8 caches, as timed; compiled ${CHECK_COMPILE:-$C})"
  timeout 300 python3 bench/peer/peer.py --check --device cuda --cache fp8 --compile ${CHECK_COMPILE:-$C} 2>&1 | tail -8
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/gate.log 2>&1
timeout 200 $M3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16,64 --context 4096 \
  --iters 40 --rounds 2 --out $OUT/m3-mx.json > $OUT/m3-mx.log 2>&1
timeout 200 $M3 bench --backend gpu --preset m3.1 --layers 8 --weights bf16 --batch $B --context 4096 \
  --iters 40 --rounds 2 --out $OUT/m3-bf16.json > $OUT/m3-bf16.log 2>&1
fi
[ "$P" = m3 ] && { echo done; exit 0; }
timeout ${PEER_TIMEOUT:-900} python3 bench/peer/peer.py --preset m3.1 --layers 8 --batch $B --context 4096 --cache fp8 \
  --compile $C --iters 100 --rounds 2 --out $OUT/peer.json > $OUT/peer.log 2>&1
[ "$P" = peer ] && { echo done; exit 0; }
python3 bench/peer/ratios.py --m3 $OUT/m3-bf16.json --peer $OUT/peer.json --out $OUT/ratios.json > $OUT/ratios.log 2>&1
echo done
