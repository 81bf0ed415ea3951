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
