#!/usr/bin/env bash
# Session 8: is the standard path's slower batch-1 step the 256-thread
# m3s_rmsnorm? The binary before the session (m3-old, 1024 threads) against
# this one, standard path only, same call, with a per-launch profile.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
for b in m3-old m3 m3-old m3; do
  echo "=== $b"
  timeout 60 /tmp/bin/$b bench --backend gpu --preset m3.1 --layers 12 --batch 1,16 --context 4096 \
    --iters 40 --rounds 2 --profile 2>&1 | grep -E "^\| decode|^profile|rmsnorm"
done
