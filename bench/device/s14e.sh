#!/usr/bin/env bash
# Session 14 (issue 12): why a 64-row step is 2x session 10's (m3.1
# --layers 12: 54 ms against 28.5): the per-launch profile at 16 and 64
# rows, and the tensor-core linear's shapes forced on the 64-row step
# (--variants; NVRTC 13.0 here: the default 8-warp 8-tile MX entries
# spill 136-176 bytes a thread at 128 registers, S_MMA_MINB=1 lets them
# take 202-254 with none). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 16,64 --context 4096 --iters 10 --rounds 1 \
  --profile > $OUT/profile.log 2>&1
grep -E "^profile|^ +[a-z_0-9]+ +[0-9.]+ ms" $OUT/profile.log | awk '/^profile/{n=0} {if (n++ < 14) print}'
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 32,64 --context 4096 --iters 20 --rounds 1 \
  --variants "S_MMA_WARPS=4 S_MMA_MAXBT=2;S_MMA_WARPS=4 S_MMA_MAXBT=4;S_MMA_WARPS=8 S_MMA_MAXBT=4;S_MMA_MINB=1" \
  > $OUT/variants.log 2>&1
grep -E "^\| .*b(32|64)|rror" $OUT/variants.log
