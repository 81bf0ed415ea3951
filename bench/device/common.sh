#!/usr/bin/env bash
# Shared pieces of the device scripts (source it from the repository root
# on the device machine). Earlier scripts carry their own copies: they are
# the record of what ran (s23b.sh's and s25a.sh's unit-test loops, the same
# commands as m3_unit, now call it).

# Unpack .carry/bin.tar.xz into /tmp/bin (and each NAME of "$@" from
# .carry/NAME.tar.xz into /tmp/NAME); the kernel cache and the path the
# golden tool expects.
m3_setup() {
  mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
  for n in "$@"; do mkdir -p "/tmp/$n" && tar -C "/tmp/$n" -xJf ".carry/$n.tar.xz"; done
  export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
  # the seeded kernel cache (pack.sh: the default CUDA units by NVRTC 13.0,
  # the device's), so a fresh card loads them instead of compiling
  if [ -f .carry/kc.tar.xz ] && [ ! -e /tmp/kc/.seeded ]; then
    mkdir -p /tmp/kc && tar -C /tmp/kc -xJf .carry/kc.tar.xz && ls /tmp/kc > /tmp/kc/.seeded
    echo "kernel cache seeded: $(wc -l < /tmp/kc/.seeded) CUBINs"
  fi
  [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
}

# The engine's GPU unit tests under REQUIRE_GPU=1: m3_unit SECONDS FILTER...
# runs test-m3_gpu once a filter (each within SECONDS: a cold kernel cache
# compiles every linear variant first) and prints each test's verdict.
m3_unit() {
  local secs=$1
  shift
  for f in "$@"; do
    echo "=== test m3_gpu $f, REQUIRE_GPU=1 ($(date +%T))"
    REQUIRE_GPU=1 timeout "$secs" /tmp/bin/test-m3_gpu "$f" --test-threads=1 --nocapture 2>&1 \
      | grep -E "^test .*(ok|FAILED)$|^test result|panicked|failure|off|differ" | tail -30
  done
}

# The device check under REQUIRE_GPU=1: every runner test (mono bitwise
# the standard path, the GPU runner against the CPU), backend_ops, golden
# through the GPU, parity small (MXFP4 experts, MXFP8 dense) on the
# standard and mono paths. Prints its findings. A change to the weight
# layout or the linears' loads also needs test-m3_gpu's
# variants_match_an_f64_reference (K = 160 shapes no preset has: s20a.sh).
m3_verify() {
  for t in runner backend_ops; do
    echo "=== test $t, REQUIRE_GPU=1 ($(date +%T))"
    REQUIRE_GPU=1 timeout 360 /tmp/bin/test-$t --test-threads=1 --nocapture 2>&1 | grep -E "^test |^test result|panicked|bitwise|FAIL" | tail -24
  done
  echo "=== golden --backend gpu ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -E "golden:|FAIL|fail" | tail -8
  mkdir -p /tmp/ck
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out /tmp/ck/small --draft-layers 0 -q
  for p in standard mono; do
    echo "=== parity small $p ($(date +%T))"
    REQUIRE_GPU=1 timeout 120 /tmp/bin/m3 parity --model /tmp/ck/small --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
  done
}

# The kernel microbench on m3.1's shapes: m3_kernels NAME SECS ARGS...
# runs `m3 bench --kernels --kernel-reps 1 ARGS` (within SECS) into
# $OUT/NAME.log and prints its exit status and the cases' x/row rows.
m3_kernels() {
  local name=$1 secs=$2
  shift 2
  echo "=== $name ($(date +%T))"
  timeout "$secs" /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 "$@" > "$OUT/$name.log" 2>&1
  echo "exit $?"
  grep -E "x/row|rror|^ceiling" "$OUT/$name.log" | cut -c1-200
}

# Interleaved A/B of `m3 bench`: m3_ab ROUNDS "BENCH ARGS" BIN... runs
# `BIN bench BENCH ARGS` for each binary in turn, ROUNDS times, and prints
# the per-layer rows (`| decode ... / ...`) under a header naming the
# binary and round. Binaries: /tmp/bin/m3, /tmp/old/m3 (m3_setup old), or
# `env VAR=X /tmp/bin/m3` forms quoted as one word.
m3_ab() {
  local rounds=$1 args=$2
  shift 2
  for r in $(seq 1 "$rounds"); do
    for m in "$@"; do
      echo "=== $m round $r ($(date +%T))"
      # shellcheck disable=SC2086
      timeout 150 $m bench $args 2>&1 | grep -E "^\| (decode|verify).*/|^ceiling|rror"
    done
  done
}

# Interleaved A/B of named variants: m3_variants ROUNDS "BENCH ARGS"
# NAME... runs `variant NAME /tmp/bin/m3 bench BENCH ARGS` for each name
# in turn, ROUNDS times (the calling script defines `variant NAME CMD...`:
# CMD with NAME's environment), printing the per-layer rows and the parity
# gate's verdict under a header per run (the per-layer rows with or
# without `--path both`'s `[path]` tag: session 40 lost an A/B's rows to
# a grep that kept only the tagged ones). Every variant's kernels are
# compiled first (the first variant's alone, then the rest at once) on
# m3.1 --layers 4 at 1, 4 and 16 rows (a
# tiny-model warm-up does not build m3.1's kernels: session 32's s32a.sh
# lost three timed runs to compiling); a warm-up that fails prints its
# log's tail. `variant` should fail on a name it does not know.
m3_variants() {
  local rounds=$1 args=$2 v
  shift 2
  warm() {
    variant "$1" timeout "$2" /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 4 --batch 1,4,16 \
      --iters 1 --rounds 1 --warmup 1 --parity-steps 0 --path both > "/tmp/compile-$1.log" 2>&1 \
      || { echo "warm-up of $1 failed:"; tail -5 "/tmp/compile-$1.log"; }
  }
  # the first variant alone (the kernels every variant shares), then the
  # rest at once (session 34: three cold processes at once did not finish
  # in 200 s)
  warm "$1" 300
  for v in "${@:2}"; do
    warm "$v" 200 &
  done
  wait
  echo "compiled ($(date +%T))"
  for r in $(seq 1 "$rounds"); do
    for v in "$@"; do
      echo "=== $v round $r ($(date +%T))"
      # shellcheck disable=SC2086
      variant "$v" timeout 60 /tmp/bin/m3 bench $args 2>&1 | grep -E "^\| (\[[^]]*\] )?decode[^|]*\| [0-9.]+ / |^mono parity|differ|rror"
    done
  done
}

# m3_variants over define sets in an environment variable: m3_env_ab VAR
# ROUNDS "BENCH ARGS" NAME=DEFINES... (DEFINES empty: the build's defaults)
# runs each NAME with VAR=DEFINES. Check each string on the simulator
# before the call (bench/NOTES.md session 35: a whitelist refusal costs
# the call).
m3_env_ab() {
  local var=$1 rounds=$2 args=$3 kv
  shift 3
  declare -gA M3_AB_DEFS=()
  declare -g M3_AB_VAR=$var
  local names=()
  for kv in "$@"; do
    M3_AB_DEFS[${kv%%=*}]=${kv#*=}
    names+=("${kv%%=*}")
  done
  variant() {
    local v=$1
    shift
    [ -n "${M3_AB_DEFS[$v]+x}" ] || { echo "no variant $v" >&2; return 1; }
    if [ -z "${M3_AB_DEFS[$v]}" ]; then "$@"; else env "$M3_AB_VAR=${M3_AB_DEFS[$v]}" "$@"; fi
  }
  m3_variants "$rounds" "$args" "${names[@]}"
}

# Small-step define sets (M3_SMALL_STEP_DEFINES, which feeds the mono build
# too): m3_defines_ab ROUNDS "BENCH ARGS" NAME=DEFINES...
m3_defines_ab() { m3_env_ab M3_SMALL_STEP_DEFINES "$@"; }

# The mono build's define sets (M3_MONO_DEFINES): m3_mono_ab ROUNDS
# "BENCH ARGS" NAME=DEFINES...
m3_mono_ab() { m3_env_ab M3_MONO_DEFINES "$@"; }

# The figures of record (PERF.md's protocol): the bench model at batch
# 1-64, 4k and 128k, 3 rounds, into $OUT/table.json and table.log.
m3_record() {
  timeout 500 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,2,4,8,16,32,64 \
    --context 4096 --long-context 131072 --iters 200 --rounds 3 --out $OUT/table.json > $OUT/table.log 2>&1
  echo "exit $?" >> $OUT/table.log
  grep -vE "^round " $OUT/table.log | tail -40
}

# Nsight Compute on one b1 mono layer (m3.1 --layers 12, 4k; the sixth
# m3s_mono launch), as sessions 30 and 31 ran it (their scripts keep their
# own copies): $OUT/mono1.txt (every section's details), $OUT/mono1-sass.csv.xz
# (per SASS line: bench/tools/sass_profile.py reads it), $OUT/ncu-mono.txt
# (the run's log). m3_ncu_mono [SECONDS, default 110].
m3_ncu_mono() {
  local ncu=/usr/local/cuda/bin/ncu
  local s="--section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy"
  echo "=== ncu ($(date +%T))"
  # shellcheck disable=SC2086
  timeout "${1:-110}" $ncu --target-processes all -k regex:m3s_mono --launch-skip 5 --launch-count 1 $s --import-source no \
    -o $OUT/mono1 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 \
    --warmup 0 --batch 1 --path mono > $OUT/ncu-mono.txt 2>&1
  $ncu -i $OUT/mono1.ncu-rep --print-details all > $OUT/mono1.txt 2>&1
  $ncu -i $OUT/mono1.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/mono1-sass.csv.xz
  rm -f $OUT/*.ncu-rep
  tail -2 $OUT/ncu-mono.txt
}

# The kernel-cache files written since the seed (compiled on this card:
# variants, wide builds, or a seed that missed its key).
m3_cache_report() {
  [ -e /tmp/kc/.seeded ] || return 0
  ls /tmp/kc | grep -v -x -F -f /tmp/kc/.seeded | grep -v '^\.seeded$' | wc -l \
    | xargs -I{} echo "kernel cache: {} CUBINs compiled on this card beside $(wc -l < /tmp/kc/.seeded) seeded"
}
