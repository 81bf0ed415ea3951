set -u
# (historical: S_DEC_NOFALLBACK was removed after this run; see bench/NOTES.md session 4 run 4)
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
{
  timeout 200 $M3 bench --backend gpu --kernels --preset m3.1 --iters 30 --kernel-formats mxfp4,mxfp8,nvfp4 --kernel-rows 1,4,16 --kernel-experts 16 \
    --variants "S_DEC_NOFALLBACK=1;S_MMA_WARPS=4 S_MMA_MAXBT=2 S_DEC_NOFALLBACK=1" --out $OUT/kernels4.json 2>&1
  echo "exit $?"
} > $OUT/kernels4.log 2>&1
{
  for d in "" "S_MMA_WARPS=8 S_MMA_MAXBT=2" "S_MMA_WARPS=4 S_MMA_MAXBT=8"; do
    echo "=== runner tests, small-step variant on, defines '${d:-default}'"
    M3_SMALL_STEP_VARIANT=1 M3_SMALL_STEP_DEFINES="$d" timeout 100 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "test |panicked|residual|result" | head -12
  done
} > $OUT/runner4.log 2>&1
{
  for v in 0 1; do
    echo "=== bench, M3_SMALL_STEP_VARIANT=$v"
    M3_SMALL_STEP_VARIANT=$v timeout 120 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,4,16 --iters 50 --rounds 2 --out $OUT/b$v.json 2>&1 | grep -E "^\| decode|ceiling"
  done
} > $OUT/bench4.log 2>&1
echo done
