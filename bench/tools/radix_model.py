#!/usr/bin/env python3
"""A model of `sk_radix_kth` (kernels/standard_attention.cu): the index
top-k's radix select, pass by pass, checked against a sort.

Usage: radix_model.py [ROWS]   (numpy; e.g. the .venv `cargo xtask kernels` makes)
Each row: 257-6000 blocks, K in {1, 8, 16, 64}, scores of five kinds
(distinct normals, many equal integers, NaN / +-inf / +-0 mixed in, fewer
valid blocks than K, a narrow band). The picks (keys >= the cut) must be
the K largest keys (score descending, then lower block id), NaN never
picked. Prints the mean and largest number of passes (the kernel's cost).
"""
import struct
import sys

import numpy as np


def key(v, b):
    """sk_key: 0 for NaN, else the order of the score's bits, then ~b."""
    if v != v:
        return 0
    if v == 0.0:
        v = 0.0
    u = struct.unpack("<I", struct.pack("<f", v))[0]
    ordv = (~u) & 0xFFFFFFFF if u & 0x80000000 else u | 0x80000000
    return (ordv << 32) | ((~b) & 0xFFFFFFFF)


def kth(keys, nb, k):
    """sk_radix_kth: (cut, passes); cut 0 = take every valid key."""
    idb = 1 if nb <= 0x100 else 2 if nb <= 0x10000 else 3
    prefix = mask = 0
    for i in range(idb, 4):
        prefix |= 0xFF << (8 * i)
        mask |= 0xFF << (8 * i)
    want, passes = k, 0
    for byte in range(7, -1, -1):
        if byte < 4 and byte >= idb:
            continue
        passes += 1
        sh = 8 * byte
        hist = [0] * 256
        for x in keys:
            if x != 0 and (x & mask) == prefix:
                hist[(x >> sh) & 0xFF] += 1
        if byte == 7 and sum(hist) <= k:
            return 0, passes
        above = 0
        for d in range(255, -1, -1):
            if above + hist[d] >= want:
                break
            above += hist[d]
        count = hist[d]
        prefix |= d << sh
        mask |= 0xFF << sh
        want -= above
        if want == count:
            return prefix, passes
    return prefix, passes


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    rng = np.random.default_rng(1)
    passes = []
    for trial in range(rows):
        nb = int(rng.integers(257, 6000))
        k = int(rng.choice([16, 8, 64, 1]))
        kind = trial % 5
        if kind == 0:
            v = rng.standard_normal(nb).astype(np.float32)
        elif kind == 1:
            v = rng.integers(-3, 3, nb).astype(np.float32)
        elif kind == 2:
            v = rng.standard_normal(nb).astype(np.float32)
            v[rng.random(nb) < 0.5] = np.nan
            v[:3] = np.inf
            v[5] = -np.inf
            v[7] = -0.0
            v[8] = 0.0
        elif kind == 3:
            v = np.full(nb, np.nan, np.float32)
            v[rng.integers(0, nb, int(rng.integers(0, k + 3)))] = 1.0
        else:
            v = (rng.standard_normal(nb) * 1e-3 + 5).astype(np.float32)
        keys = [key(float(x), b) for b, x in enumerate(v)]
        cut, p = kth(keys, nb, k)
        passes.append(p)
        got = sorted(b for b, x in enumerate(keys) if x != 0 and x >= cut)
        best = sorted((x for x in keys if x != 0), reverse=True)[:k]
        want = sorted((~x) & 0xFFFFFFFF for x in best)
        assert got == want, (trial, kind, nb, k, len(got), len(want))
    print(f"{rows} rows: picks = a sort's; passes mean {np.mean(passes):.2f}, max {max(passes)}")


if __name__ == "__main__":
    main()
