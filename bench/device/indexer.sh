#!/usr/bin/env bash
# Session 7 (issue 12 item 5): the indexer at 128k context. m3-old (the
# index-scores grid capped at 256 CTAs a row) against m3 (about 2048 CTAs a
# launch: one 128-key block a CTA at batch 1), same call: the step at 4k
# and 128k context, batch 1 and 16, with a per-launch profile.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
for b in m3-old m3; do
  [ -x /tmp/bin/$b ] || continue
  {
    echo "=== $b"
    timeout 250 /tmp/bin/$b bench --backend gpu --preset m3.1 --layers 12 --batch ${BATCH:-1,16} --context 4096 \
      --long-context 131072 --iters 40 --rounds 2 --profile --out $OUT/idx-$b.json 2>&1 | grep -v "^round"
    echo "exit ${PIPESTATUS[0]}"
  } > $OUT/idx-$b.log 2>&1
done
echo done
