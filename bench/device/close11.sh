#!/usr/bin/env bash
# Session 11 (issue 12): the MX linears on f16 tensor cores in the engine.
# Correctness on the H200 under REQUIRE_GPU=1 (the linear's f64 variant
# tests, runner, backend_ops, golden through the GPU, parity standard and
# mono), then speed against the tree before it (.carry/base.tar.xz) in the
# same call: the kernel microbench and the bench model's per-layer figure.
# SECTIONS picks parts (tests kernels layers golden). Logs to $OUT.
set -u
mkdir -p /tmp/bin /tmp/base && tar -C /tmp/bin -xJf .carry/bin.tar.xz && tar -C /tmp/base -xJf .carry/base.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
want() { case " ${SECTIONS:-tests kernels layers golden} " in *" $1 "*) return 0 ;; esac; return 1; }
step() { echo; echo "=== $* ($(date +%T))"; }
want tests && {
  for t in m3_gpu runner backend_ops; do
    step "test $t"
    f=""; [ $t = m3_gpu ] && f=${M3GPU_FILTER:-}
    REQUIRE_GPU=1 timeout 240 /tmp/bin/test-$t $f --test-threads=1 --nocapture 2>&1 | grep -E "^test .*FAILED|^test result|panicked|failures:|outputs off|off,|failing|any-scale kernels|any_scale" | tail -30
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/tests.log 2>&1
want tests && grep -E "===|exit|result" $OUT/tests.log
want kernels && {
  for b in ${KBINS:-bin base}; do
    step "kernels $b"
    M3_KERNEL_CACHE=/tmp/kc-$b timeout 150 /tmp/$b/m3 bench --backend gpu --kernels --preset m3.1 \
      --kernel-formats ${KFMTS:-mxfp4,mxfp8,nvfp4,mxfp8-e5m2} --kernel-rows 1,16 --iters 30 2>&1 | grep -E "^\||ceiling|rror"
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/kernels.log 2>&1
want kernels && grep -E "===|exit|m1 \||m16 \|" $OUT/kernels.log | grep -E "===|exit|MAXBT" | head -60
want layers && {
  for r in 1 2; do
    for b in base bin; do
      step "layers $b round $r"
      M3_KERNEL_CACHE=/tmp/kc-$b timeout 120 /tmp/$b/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,16 --context 4096 --iters 40 --rounds 1 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/layers.log 2>&1
want layers && grep -E "===|exit|MoE" $OUT/layers.log | head -40
want golden && {
  step "golden --backend gpu (REQUIRE_GPU=1)"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -v "^ *[0-9]*: \|^Stack\|^$" | grep -E "fail|FAIL|pass$|golden|rror" | grep -v " pass$" | tail -20
  echo "exit ${PIPESTATUS[0]}"
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset tiny --experts mxfp4 --dense mxfp8 --out $CK/tiny --draft-layers 0 -q
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for m in tiny small; do
    for p in standard mono; do
      step "parity $m gpu --path $p"
      timeout 150 /tmp/bin/m3 parity --model $CK/$m --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -2
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/golden.log 2>&1
want golden && grep -E "===|exit|parity|golden|rror|FAIL|fail" $OUT/golden.log | head -40
echo done
