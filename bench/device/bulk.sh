#!/usr/bin/env bash
# Session 10 (issue 12): the MX linears' weights streamed into shared memory
# by the bulk-copy engine (S_MMA_BULK=1, standard_decode.cu
# s_mma_linear_bulk) against the small-step variant: the variants' f64 and
# bitwise test, the kernel microbench and the step, one call.
# VARIANTS / SECTIONS / KROWS / BATCH narrow it.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V=${VARIANTS:-"$S S_MMA_BULK=1;$S S_MMA_BULK=1 S_BULK_NS=2;$S S_MMA_BULK=1 S_BULK_NS=6;$S S_MMA_BULK=1 S_BULK_XROWS=0"}
want() { case " ${SECTIONS:-tests kernels layers} " in *" $1 "*) return 0 ;; esac; return 1; }
want tests && {
  step "test m3_gpu variants"
  timeout 240 /tmp/bin/test-m3_gpu variants --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | tail -30
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/tests.log 2>&1
cat $OUT/tests.log | tail -8
want kernels && {
  step "kernel microbench"
  timeout 300 $M3 bench --backend gpu --kernels --preset m3.1 --iters 30 --kernel-rows ${KROWS:-1,4,16} ${KARGS:-} --variants "$V" --out $OUT/kernels.json 2>&1 | grep -v "^round"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/kernels.log 2>&1
tail -40 $OUT/kernels.log
want layers && {
  step "step, --per-layer 6, bulk variants"
  timeout 300 $M3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch ${BATCH:-1,4,16} --context 4096 --iters 40 --rounds 2 ${LARGS:-} \
    --variants "$V" --out $OUT/layers.json 2>&1 | grep -v "^round"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/layers.log 2>&1
tail -30 $OUT/layers.log
echo done
