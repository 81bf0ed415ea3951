#!/usr/bin/env bash
# Pack the release binaries a device run needs into .carry/bin.tar.xz
# (stripped: the device call carries at most 64 MiB). Run after
# `cargo build --release -p m3-cli -p xtask` and
# `cargo test --release -p m3-gpu --no-run`.
set -eu
cd "$(dirname "$0")/../.."
d=$(mktemp -d)
cp target/release/m3 target/release/xtask "$d/"
for t in runner sampling compile ops formats spec_vectors backend_ops draft m3_gpu; do
  f=$(ls -t target/release/deps/$t-* | grep -v '\.d$' | head -n1)
  cp "$f" "$d/test-$t"
done
strip "$d"/*
mkdir -p .carry
tar -C "$d" -cJf .carry/bin.tar.xz .
rm -rf "$d"
ls -la .carry/bin.tar.xz
# The kernel cache a fresh card starts from (common.sh's m3_setup): the
# default CUDA units compiled by the device's NVRTC (13.0, from PyPI;
# kept under target/kc-seed, only changed units recompile, ~5 min for
# all on two cores). M3_NO_SEED=1 skips it.
if [ "${M3_NO_SEED:-0}" != 1 ]; then
  lib=/tmp/nvrtc130/nvidia/cu13/lib
  if [ ! -e $lib/libnvrtc.so.13 ]; then
    pip download -q --no-deps -d /tmp/whl130 nvidia-cuda-nvrtc==13.0.88
    mkdir -p /tmp/nvrtc130 && python3 -m zipfile -e /tmp/whl130/nvidia_cuda_nvrtc-13.0.88-*.whl /tmp/nvrtc130
  fi
  target/release/xtask kernels --seed-cache target/kc-seed --nvrtc-lib $lib
  tar -C target/kc-seed -cJf .carry/kc.tar.xz .
  ls -la .carry/kc.tar.xz
fi
