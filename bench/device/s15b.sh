#!/usr/bin/env bash
# Session 15, call 2 (issue 12): where the small-step tensor-core shape
# (S_MMA_WARPS=4 S_MMA_MAXBT=2) stops beating the default 8-warp build.
# Run 1 (s15a.sh) found it faster at every step of 32-256 rows; the
# scheduler's steps reach 2048 rows (max_batch_tokens), so steps of
# 256-2048 rows (one sequence a row, short context so the caches fit),
# with the shape taken up to 16 rows (the default build past) against up
# to 4096 rows (always). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
for round in 1 2; do
  for n in 16 4096; do
    echo "=== round $round: small-step shape to $n rows"
    M3_SMALL_STEP_MAX_ROWS=$n timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 \
      --batch 256,512,1024,2048 --context 512 --iters 5 --rounds 1 2>&1 | grep -E "^\| decode|rror"
  done
done > $OUT/large.log 2>&1
cat $OUT/large.log
